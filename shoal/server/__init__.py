"""The parent process: the CLI, the supervisor of the broker and the frontends, their restarts,
systemd notifications."""
