"""trainmedic: remediation runbooks for large-model pre-training clusters."""

__version__ = "0.1.0"
