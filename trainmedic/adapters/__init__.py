"""Everything that talks to the outside: scheduler, Ansible, telemetry, events, notifications,
the intake and the checkpoint store."""
