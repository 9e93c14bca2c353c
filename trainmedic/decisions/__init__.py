"""Pure decisions: the remediation plan, the one "may we act" guard, the attempt chain, the
training curve. No I/O, no clock, no Prefect."""
