"""Every runbook's Markdown report (Prefect artifacts), built from its result. Pure."""
