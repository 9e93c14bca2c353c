"""The shared vocabulary: models, taxonomy, validation, errors, settings, file primitives."""
