"""qosflow: deadline-driven (QoS) training for ML pipelines on Airflow and Argo Workflows.

The package is the pure core (spec, speed model, prediction, decision, priority, admission,
history), the simulator, the reference trainer, the embedded local cluster and the CLI. It never
imports airflow, hera or kubernetes.
"""

__version__ = "0.1.0"
