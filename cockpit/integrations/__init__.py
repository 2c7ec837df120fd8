"""Callbacks for the frameworks people train with, reporting to cockpit through cockpit.report.

- `cockpit.integrations.transformers.CockpitCallback`: Hugging Face's Trainer (and TRL's
  trainers, which are Trainers).
- `cockpit.integrations.lightning.CockpitCallback`: PyTorch Lightning (`lightning` or
  `pytorch_lightning`).

Each module imports its framework when it is imported, not before: cockpit depends on neither.
Outside cockpit the callbacks do nothing, so a script that adds one runs anywhere unchanged.
"""
