"""The deterministic trace-driven cluster simulator (DESIGN §4, §6).

* :mod:`qosflow.sim.engine` — the discrete-event loop (:func:`~qosflow.sim.engine.simulate`);
* :mod:`qosflow.sim.policy` — the ``Policy`` Protocol and the per-decision snapshot types; read its
  docstring to plug a policy in;
* :mod:`qosflow.sim.placement` — ElasticFlow's buddy placement of jobs onto nodes;
* :mod:`qosflow.sim.trace` and :mod:`qosflow.sim.workload` — trace loaders and synthetic workloads;
* :mod:`qosflow.sim.bound` — the upper bound on deadlines any policy can meet;
* :mod:`qosflow.sim.truth` — true speeds (throughput tables) and the noise model;
* :mod:`qosflow.sim.policies` — ``k8s-default``, ``edf-elastic``, ``elasticflow`` (and others').
"""

from __future__ import annotations
