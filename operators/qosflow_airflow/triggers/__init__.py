"""Triggers of the qosflow provider (they run in the triggerer, so they live in the package)."""
