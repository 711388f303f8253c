"""The kubelet's part of starting a pod: bind it, set up its volumes and environment, start it.

Once the scheduler bound a pod to the node (:func:`bind`: ``nodeName``, ``PodScheduled``,
``startTime``), :func:`start_container` prepares its ``main`` container and starts it through the
runner:

* volumes become host folders (:mod:`qosflow.local.pod_volumes`); a ConfigMap or Secret volume
  whose object is missing leaves the container waiting in ``ContainerCreating`` with the
  kubelet's ``MountVolume.SetUp failed ...`` message (upstream reports it as a ``FailedMount``
  event; the local cluster has no events, so it is the waiting message);
* the environment is resolved (:mod:`qosflow.local.pod_env`); a missing Secret, ConfigMap or key
  leaves it waiting in ``CreateContainerConfigError``;
* ``$(VAR)`` in ``command`` and ``args`` is expanded.

A waiting pod stays Pending, bound (its requests count on the node, as a bound pod's do), and is
retried every tick until what it needs exists. A volume kind the local cluster cannot provide
fails the pod with a message naming it.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

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
from qosflow.local.runner import PodLaunch
from qosflow.local.sandbox import Mount, argo_dir, progress_file
from qosflow.local.store import Obj

if TYPE_CHECKING:
    from qosflow.local.node import Node

HOST_IP = "127.0.0.1"
NO_COMMAND = (
    "the local cluster runs the container command and ignores images: this container has no command"
)


def allocatable(node: Node) -> dict[str, Decimal]:
    """The node's allocatable resources (the default of a limit the container leaves unset)."""
    disk = shutil.disk_usage(node.store.state_dir).total
    return {
        "cpu": Decimal(node.cpus),
        "memory": Decimal(node.memory),
        "ephemeral-storage": Decimal(disk),
    }


def bind(node: Node, pod: Obj, node_name: str, now: float) -> None:
    """The scheduler's binding and the kubelet's admission: the pod is on the node, Pending."""
    stamp = rfc3339(now) or ""
    pod["spec"]["nodeName"] = node_name
    set_condition(pod, "PodScheduled", "True", stamp)
    pod["status"].update({"hostIP": HOST_IP, "podIP": HOST_IP, "startTime": stamp})
    node.store.touch(pod)


def launch_spec(
    node: Node,
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
    workdir = pod_dir(node.store.state_dir, meta["namespace"], meta["name"])
    return PodLaunch(
        pod=meta["name"],
        namespace=meta["namespace"],
        workflow=(meta.get("labels") or {}).get(LABEL_WORKFLOW, ""),
        node_id=(meta.get("annotations") or {}).get("workflows.argoproj.io/node-id", ""),
        argv=tuple(argv),
        env=dict(env or {}),
        cores=node.host_cores(cores),
        cpus=cpu / 1000,
        workdir=workdir,
        progress_file=progress_file(workdir),
        on_exit=node.wake,
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


def wait(node: Node, pod: Obj, reason: str, message: str, now: float) -> None:
    """Leave the container waiting (the pod stays Pending); touch the pod only on a change."""
    state = {"waiting": {"reason": reason, "message": message}}
    statuses = pod["status"].get("containerStatuses") or []
    if statuses and statuses[0].get("state") == state:
        return
    stamp = rfc3339(now) or ""
    unready = "containers with unready status: [main]"
    set_condition(pod, "Initialized", "True", stamp)
    for ctype in ("ContainersReady", "Ready"):
        set_condition(pod, ctype, "False", stamp, reason="ContainersNotReady", message=unready)
    pod["status"]["containerStatuses"] = [
        _container_status(main_container(pod), state, started=False)
    ]
    node.store.touch(pod)


def _prepare(node: Node, pod: Obj, now: float) -> tuple[Any, ...] | None:
    """Volumes, environment and argv of the container, or ``None`` when it cannot start now."""
    container = main_container(pod)
    meta = pod["metadata"]
    workdir = pod_dir(node.store.state_dir, meta["namespace"], meta["name"])
    argo_dir(workdir).mkdir(parents=True, exist_ok=True)
    try:
        mounts = pod_mounts(node.store, pod, container, workdir)
        env = container_environment(node.store, pod, container, allocatable(node))
    except MountPending as exc:
        wait(node, pod, "ContainerCreating", exc.message, now)
        return None
    except ContainerConfigError as exc:
        wait(node, pod, "CreateContainerConfigError", exc.message, now)
        return None
    except UnsupportedVolume as exc:
        node.finish(pod, now, 128, f"the local cluster cannot run this pod: {exc}")
        return None
    argv = container_argv(container, env)
    if not argv:
        node.finish(pod, now, 128, NO_COMMAND)
        return None
    return mounts, env, argv


def start_container(node: Node, pod: Obj, now: float) -> None:
    """Start the bound pod's ``main`` container, or leave it waiting (see the module docstring)."""
    prepared = _prepare(node, pod, now)
    if prepared is None:
        return
    mounts, env, argv = prepared
    key, cpu = pod_key(pod), desired_cpu(pod)
    cores = node.pick_cores(cpu, [], exclude=key)
    launch = launch_spec(node, pod, cores, cpu, env=env, argv=argv, mounts=mounts)
    launch.progress_file.unlink(missing_ok=True)
    try:
        process = node.runner.launch(launch, now)
    except OSError as exc:
        node.finish(pod, now, 128, f"failed to start container: {exc}")
        return
    node.procs[key] = process
    node.store.runtime[key] = {
        "pid": process.pid,
        "start_ticks": process.start_ticks,
        "cores": cores,
        "progress_file": str(launch.progress_file),
        "term_at": None,
    }
    stamp = rfc3339(now) or ""
    status = pod["status"]
    status["phase"] = "Running"
    for ctype in ("Initialized", "ContainersReady", "Ready"):
        set_condition(pod, ctype, "True", stamp)
    state = {"running": {"startedAt": stamp}}
    cid = f"local://{process.pid or key}"
    status["containerStatuses"] = [
        _container_status(main_container(pod), state, started=True, cid=cid)
    ]
    status["observedGeneration"] = pod["metadata"].get("generation", 1)
    node.store.touch(pod)
