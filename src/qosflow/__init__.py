"""qosflow: deadline-driven (QoS) training for ML pipelines on Airflow and Argo Workflows.

Packages, each a layer (import contracts check them in ``make check``):

* :mod:`qosflow.core` — the pure decision logic (no I/O, no clock, no threads, no SQL);
* :mod:`qosflow.store` — the history store and the promise ledger (SQLAlchemy);
* :mod:`qosflow.sim` — the simulator, its trace loaders, baselines and the upper bound;
* :mod:`qosflow.local` — the embedded local cluster (emulated Argo Server + Kubernetes API);
* :mod:`qosflow_trainer` — the reference trainer and the helper API for training loops;
* :mod:`qosflow.cli` — the ``qosflow`` command.

It never imports airflow; the Argo client (``qosflow_argo``) and the Airflow provider
(``qosflow_airflow``) are the shells over it.
"""

__version__ = "0.1.0"
