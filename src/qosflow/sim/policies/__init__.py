"""Simulator policies, each a small module deciding through the ``Policy`` Protocol.

Mine: ``k8s-default`` (:mod:`.k8s_default`), ``edf-elastic`` (:mod:`.edf_elastic`) and
``elasticflow`` (:mod:`.elasticflow`, planner in :mod:`.ef_plan`). Import the module you need;
this package has no side effects.
"""

from __future__ import annotations
