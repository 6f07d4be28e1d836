"""What every child process shares: child-process hygiene and logging (``lifecycle``), the
status pipe and runtime-dir sweep (``supervision``), port checks (``ports``), and accelerator
discovery (``devices``)."""
