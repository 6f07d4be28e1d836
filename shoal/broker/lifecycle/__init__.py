"""Model lifecycle (docs/architecture.md §6): which generation of each model serves, loads or
drains; load overrides; device memory admission; repository polling. Pure parts, driven by the
broker loop."""
