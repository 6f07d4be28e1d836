"""What a model's configuration means, shared by every process: ``config.pbtxt`` parsed,
normalized and checked (``model_config``, ``model_config_checks``), load overrides and model
names (``load_overrides``), and the sequence batcher's settings (``sequence_batching``)."""
