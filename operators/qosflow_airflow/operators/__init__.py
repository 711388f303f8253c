"""Operators of the qosflow provider: plan, submit, branch, rescale, priority bump, finish."""
