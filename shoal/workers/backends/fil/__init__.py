"""The ``fil`` backend: tree models (XGBoost, LightGBM, Treelite checkpoints such as scikit-learn
forests) with the parameters and tensors of Triton's FIL backend, so a repository written for
Triton's FIL backend serves unchanged. Runs on the CPU with each library's own prediction:
``xgboost.Booster.inplace_predict``, ``lightgbm.Booster.predict`` and ``treelite.gtil.predict``.
Optional: needs ``pip install 'shoal[trees]'``.

Modules: ``params`` (the config's FIL parameters, checked), ``forest`` (loading one model file
with its library into a predictor), ``outputs`` (scores to FIL's ``output__0``: class ids,
probabilities or regression values) and ``backend`` (the backend class).
"""
