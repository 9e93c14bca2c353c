"""Test support shared by every tier and by bench/: one embedded-stack fixture, ports,
pollers that wait for a condition (never a bare sleep), model builders and the dev corpus's
reader."""
