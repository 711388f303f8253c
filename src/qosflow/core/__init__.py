"""The pure decision logic of qosflow: no I/O, no wall clock, no threads, no SQL.

* :mod:`~qosflow.core.spec` — job and cluster specs, validated at the boundary;
* :mod:`~qosflow.core.speed` — the step-time model and the speed curves;
* :mod:`~qosflow.core.windows` — progress samples → steady windows (contended ones left out);
* :mod:`~qosflow.core.fit` — the model fitted to the windows, and the measurements;
* :mod:`~qosflow.core.predict` — the belief (median and conservative speeds) and finish times;
* :mod:`~qosflow.core.decide` — one job's decision this round;
* :mod:`~qosflow.core.priority` — laxity and the PriorityClass ladder;
* :mod:`~qosflow.core.timeline` and :mod:`~qosflow.core.admission` — the capacity timeline, the
  backward fill and the admission verdict;
* :mod:`~qosflow.core.planning` — the functions composed the way every front end calls them;
* :mod:`~qosflow.core.prior` — what a key's history says; :mod:`~qosflow.core.usage` — the CPU
  usage lines a training pod writes; :mod:`~qosflow.core.cluster` — the environment Protocols;
* :mod:`~qosflow.core.errors` — the error hierarchy.
"""
