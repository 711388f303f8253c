"""Simulator policies, each a small module deciding through the ``Policy`` Protocol.

``k8s-default`` (:mod:`.k8s_default`), ``edf-elastic`` (:mod:`.edf_elastic`), ``xing19``
(:mod:`.xing19`, the seed paper rebuilt), ``elasticflow`` (:mod:`.elasticflow`, planner in
:mod:`.ef_plan`) and ``qosflow`` (:mod:`.qosflow_policy`, the core allocator fed the simulator's snapshot).
Import the module you need; this package has no side effects.
"""

from __future__ import annotations
