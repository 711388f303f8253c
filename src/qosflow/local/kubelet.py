"""The kubelet's part of starting a pod: bind it, set up its volumes and environment, start it.

Once the scheduler bound a pod to a node (:func:`bind`: ``nodeName``, ``PodScheduled``,
``startTime``, and the pod's own loopback address, ``podIP``), :func:`start_container` prepares
its ``main`` container and starts it through the runner, pinned to cores of its node:

* volumes become host folders (:mod:`qosflow.local.pod_volumes`); a ConfigMap or Secret volume
  whose object is missing leaves the container waiting in ``ContainerCreating`` with the
  kubelet's ``MountVolume.SetUp failed ...`` message (upstream reports it as a ``FailedMount``
  event; the local cluster has no events, so it is the waiting message);
* the environment is resolved (:mod:`qosflow.local.pod_env`); a missing Secret, ConfigMap or key
  leaves it waiting in ``CreateContainerConfigError``;
* ``$(VAR)`` in ``command`` and ``args`` is expanded.

A waiting pod stays Pending, bound (its requests count on the node, as a bound pod's do), and is
retried every tick until what it needs exists. A volume kind the local cluster cannot provide
fails the pod with a message naming it. A container with a ``readinessProbe`` starts not ready
(``ContainersReady`` and ``Ready`` False) until its probe passes (:mod:`qosflow.local.readiness`).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from qosflow.local.addresses import allocate
from qosflow.local.clock import rfc3339
from qosflow.local.names import pod_dir
from qosflow.local.pod_env import ContainerConfigError, container_argv, container_environment
from qosflow.local.pod_volumes import MountPending, UnsupportedVolume, pod_mounts
from qosflow.local.pods import (
    LABEL_WORKFLOW,
    desired_cpu,
    effective_requests,
    main_container,
    pod_key,
    set_condition,
)
from qosflow.local.readiness import NOT_READY, has_readiness_probe, start_probing
from qosflow.local.runner import PodLaunch
from qosflow.local.sandbox import Mount, argo_dir, progress_file
from qosflow.local.store import Obj
from qosflow.local.topology import HOST_IP, NodeInfo

if TYPE_CHECKING:
    from qosflow.local.node import Nodes

NO_COMMAND = (
    "the local cluster runs the container command and ignores images: this container has no command"
)


def allocatable(nodes: Nodes, pod: Obj) -> dict[str, Decimal]:
    """The allocatable resources of the pod's node (the default of a limit left unset)."""
    disk = shutil.disk_usage(nodes.store.state_dir).total
    return {**nodes.node_of(pod).allocatable(), "ephemeral-storage": Decimal(disk)}


def bind(nodes: Nodes, pod: Obj, node: NodeInfo, now: float) -> None:
    """The scheduler's binding and the kubelet's sandbox: the pod is on ``node`` with its address."""
    stamp = rfc3339(now) or ""
    pod["spec"]["nodeName"] = node.name
    set_condition(pod, "PodScheduled", "True", stamp)
    ip = allocate(nodes.store, node, nodes.addresses_in_use())
    pod["status"].update(
        {
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": stamp,
        }
    )
    nodes.store.touch(pod)


def launch_spec(
    nodes: Nodes,
    pod: Obj,
    cores: list[int],
    cpu: int,
    *,
    env: Mapping[str, str] | None = None,
    argv: Sequence[str] = (),
    mounts: tuple[Mount, ...] = (),
) -> PodLaunch:
    """What the runner needs to start (or find again) the ``main`` container of ``pod``."""
    meta = pod["metadata"]
    workdir = pod_dir(nodes.store.state_dir, meta["namespace"], meta["name"])
    return PodLaunch(
        pod=meta["name"],
        namespace=meta["namespace"],
        workflow=(meta.get("labels") or {}).get(LABEL_WORKFLOW, ""),
        node_id=(meta.get("annotations") or {}).get("workflows.argoproj.io/node-id", ""),
        argv=tuple(argv),
        env=dict(env or {}),
        cores=nodes.host_cores(cores),
        cpus=cpu / 1000,
        workdir=workdir,
        progress_file=progress_file(workdir),
        on_exit=nodes.wake,
        mounts=mounts,
        working_dir=str(main_container(pod).get("workingDir") or ""),
    )


def _container_status(container: Obj, state: Obj, *, started: bool, cid: str = "") -> Obj:
    """A ``containerStatuses`` entry of the ``main`` container."""
    resources = container.get("resources") or {}
    status: Obj = {
        "name": container.get("name", "main"),
        "image": container.get("image", ""),
        "imageID": "",
        "ready": started,
        "started": started,
        "restartCount": 0,
        "state": state,
        "allocatedResources": dict(effective_requests(resources)),
        "resources": {k: dict(v) for k, v in resources.items()},
    }
    if cid:
        status["containerID"] = cid
    return status


def wait(nodes: Nodes, pod: Obj, reason: str, message: str, now: float) -> None:
    """Leave the container waiting (the pod stays Pending); touch the pod only on a change."""
    state = {"waiting": {"reason": reason, "message": message}}
    statuses = pod["status"].get("containerStatuses") or []
    if statuses and statuses[0].get("state") == state:
        return
    stamp = rfc3339(now) or ""
    set_condition(pod, "Initialized", "True", stamp)
    for ctype in ("ContainersReady", "Ready"):
        set_condition(pod, ctype, "False", stamp, reason="ContainersNotReady", message=NOT_READY)
    pod["status"]["containerStatuses"] = [
        _container_status(main_container(pod), state, started=False)
    ]
    nodes.store.touch(pod)


def _prepare(nodes: Nodes, pod: Obj, now: float) -> tuple[Any, ...] | None:
    """Volumes, environment and argv of the container, or ``None`` when it cannot start now."""
    container = main_container(pod)
    meta = pod["metadata"]
    workdir = pod_dir(nodes.store.state_dir, meta["namespace"], meta["name"])
    argo_dir(workdir).mkdir(parents=True, exist_ok=True)
    try:
        mounts = pod_mounts(nodes.store, pod, container, workdir)
        env = container_environment(nodes.store, pod, container, allocatable(nodes, pod))
    except MountPending as exc:
        wait(nodes, pod, "ContainerCreating", exc.message, now)
        return None
    except ContainerConfigError as exc:
        wait(nodes, pod, "CreateContainerConfigError", exc.message, now)
        return None
    except UnsupportedVolume as exc:
        nodes.finish(pod, now, 128, f"the local cluster cannot run this pod: {exc}")
        return None
    argv = container_argv(container, env)
    if not argv:
        nodes.finish(pod, now, 128, NO_COMMAND)
        return None
    return mounts, env, argv


def start_container(nodes: Nodes, pod: Obj, now: float) -> None:
    """Start the bound pod's ``main`` container, or leave it waiting (see the module docstring)."""
    prepared = _prepare(nodes, pod, now)
    if prepared is None:
        return
    mounts, env, argv = prepared
    key, cpu = pod_key(pod), desired_cpu(pod)
    cores = nodes.pick_cores(nodes.node_of(pod), cpu, [], exclude=key)
    launch = launch_spec(nodes, pod, cores, cpu, env=env, argv=argv, mounts=mounts)
    launch.progress_file.unlink(missing_ok=True)
    try:
        process = nodes.runner.launch(launch, now)
    except OSError as exc:
        nodes.finish(pod, now, 128, f"failed to start container: {exc}")
        return
    nodes.procs[key] = process
    nodes.store.runtime[key] = {
        "pid": process.pid,
        "start_ticks": process.start_ticks,
        "cores": cores,
        "progress_file": str(launch.progress_file),
        "term_at": None,
    }
    stamp = rfc3339(now) or ""
    status = pod["status"]
    status["phase"] = "Running"
    probed = has_readiness_probe(pod)
    set_condition(pod, "Initialized", "True", stamp)
    for ctype in ("ContainersReady", "Ready"):
        if probed:
            set_condition(
                pod, ctype, "False", stamp, reason="ContainersNotReady", message=NOT_READY
            )
        else:
            set_condition(pod, ctype, "True", stamp)
    state = {"running": {"startedAt": stamp}}
    cid = f"local://{process.pid or key}"
    status["containerStatuses"] = [
        _container_status(main_container(pod), state, started=True, cid=cid)
    ]
    if probed:
        status["containerStatuses"][0]["ready"] = False
        start_probing(nodes.store.runtime[key], pod, now)
    status["observedGeneration"] = pod["metadata"].get("generation", 1)
    nodes.store.touch(pod)
