"""The loopback kubelet: a test-only node agent that runs pods as local processes (never shipped).

It plays the scheduler and the kubelet for one Node:
- registers the Node and keeps its Ready condition fresh;
- binds every unscheduled pod whose nodeSelector matches the Node (else marks it Unschedulable);
- runs each pod's init containers, then its containers, as local processes: the container's `command` and
  `args` (with `$(VAR)` expansion), its env (`value`, `secretKeyRef`, `configMapKeyRef`, `fieldRef`,
  `envFrom`), emptyDir/configMap/secret volumes bind-mounted at their mountPath in a private mount namespace,
  and `runAsUser`/`runAsGroup` honoured; the image is ignored unless `--image-command` maps it to a command;
- gives each pod its own 127.x.y.z address, reported as podIP (loopback answers on all of 127/8);
- runs readiness probes (httpGet, tcpSocket, exec) and reports phase, conditions and container states
  with exit codes; restarts containers per restartPolicy;
- on pod deletion, stops the processes (SIGTERM, then SIGKILL after the grace period) and removes the pod.

Run it as `python -m tests.cluster.kubelet --kubeconfig FILE --state-dir DIR`; SIGTERM stops every pod
process it started.
"""

import argparse
import asyncio
import base64
import contextlib
import datetime
import ipaddress
import itertools
import logging
import os
import re
import shlex
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import httpx2  # lightkube's HTTP stack
import msgspec
from lightkube import ALL_NS, ApiError, AsyncClient, KubeConfig
from lightkube.resources.core_v1 import ConfigMap, Node, NodeStatus, Pod, PodBinding, PodStatus, Secret

log = logging.getLogger("loopback-kubelet")

NODE_NAME = "loopback"
NODE_LABELS = {
    "kubernetes.io/hostname": NODE_NAME,
    "kubernetes.io/os": "linux",
    "kubernetes.io/arch": "amd64",
}
RESTART_BACKOFF_CAP = 10.0  # seconds; a real kubelet caps at 5 minutes, too slow for tests

Json = dict[str, Any]


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodConfigError(Exception):
    """The pod cannot start as specified (a missing Secret key, say); reported like CreateContainerConfigError."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: known variables are replaced, unknown ones kept, `$$` escapes."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR_REF.sub(sub, text)


class AddressPool:
    """Hands out 127.x.y.z addresses, never the same twice in a kubelet's life (no stale connections)."""

    def __init__(self, first: str = "127.10.0.1") -> None:
        self._next = itertools.count(int(ipaddress.IPv4Address(first)))

    def take(self) -> str:
        return str(ipaddress.IPv4Address(next(self._next)))


@dataclass
class ContainerRun:
    spec: Json
    process: asyncio.subprocess.Process | None = None
    started_at: str | None = None
    ready: bool = False
    restart_count: int = 0
    last_terminated: Json | None = None
    terminated: Json | None = None  # set when it exited and will not be restarted
    waiting: Json = field(default_factory=lambda: {"reason": "ContainerCreating"})


class PodRunner:
    """Runs one pod from binding to deletion."""

    def __init__(self, kubelet: "LoopbackKubelet", pod: Json) -> None:
        self.kubelet = kubelet
        self.client = kubelet.client
        self.pod = pod
        meta = pod["metadata"]
        self.name: str = meta["name"]
        self.namespace: str = meta["namespace"]
        self.uid: str = meta["uid"]
        self.ip = kubelet.addresses.take()
        self.dir = kubelet.state_dir / "pods" / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        spec = pod["spec"]
        self.containers = [ContainerRun(c) for c in spec.get("containers", [])]
        self.init_containers = [ContainerRun(c) for c in spec.get("initContainers", [])]
        self.restart_policy: str = spec.get("restartPolicy", "Always")
        self.phase = "Pending"
        self.initialized = not self.init_containers
        self.start_time = now()
        self.deleting = asyncio.Event()
        self.grace_seconds = float(spec.get("terminationGracePeriodSeconds", 30))
        self.task: asyncio.Task[None] | None = None
        self.config_error: PodConfigError | None = None

    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    # --- status -------------------------------------------------------------------------------------------

    def _container_status(self, run: ContainerRun) -> Json:
        if run.process is not None and run.process.returncode is None:
            state: Json = {"running": {"startedAt": run.started_at}}
        elif run.terminated is not None:
            state = {"terminated": run.terminated}
        else:
            state = {"waiting": run.waiting}
        status: Json = {
            "name": run.spec["name"],
            "image": run.spec.get("image", ""),
            "imageID": "",
            "ready": run.ready,
            "started": "running" in state,
            "restartCount": run.restart_count,
            "state": state,
            "lastState": {"terminated": run.last_terminated} if run.last_terminated else {},
        }
        if run.process is not None:
            status["containerID"] = f"loopback://{run.process.pid}"
        return status

    def status(self) -> Json:
        all_ready = bool(self.containers) and all(c.ready for c in self.containers)
        terminal = self.phase in ("Succeeded", "Failed")
        ready = all_ready and not terminal

        def cond(kind: str, ok: bool, reason: str | None = None) -> Json:
            c: Json = {"type": kind, "status": "True" if ok else "False", "lastProbeTime": None}
            if reason and not ok:
                c["reason"] = reason
            return c

        return {
            "phase": self.phase,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": self.start_time,
            "conditions": [
                cond("PodReadyToStartContainers", True),
                cond("Initialized", self.initialized, "ContainersNotInitialized"),
                cond("ContainersReady", ready, "ContainersNotReady"),
                cond("Ready", ready, "ContainersNotReady"),
            ],
            "initContainerStatuses": [self._container_status(c) for c in self.init_containers],
            "containerStatuses": [self._container_status(c) for c in self.containers],
        }

    async def report(self) -> None:
        status = self.status()
        if self.config_error is not None:
            for cs in status["containerStatuses"]:
                if "waiting" in cs["state"]:
                    cs["state"] = {
                        "waiting": {"reason": self.config_error.reason, "message": self.config_error.message}
                    }
        try:
            await self.client.patch(PodStatus, self.name, {"status": status}, namespace=self.namespace)
        except ApiError as err:
            if err.status.code != 404:
                log.warning("status of %s: %s", self.key(), err)

    # --- environment and volumes --------------------------------------------------------------------------

    async def _get(self, kind: type[Secret] | type[ConfigMap], name: str, optional: bool) -> Json | None:
        try:
            obj = await self.client.get(kind, name, namespace=self.namespace)
        except ApiError as err:
            if err.status.code == 404:
                if optional:
                    return None
                raise PodConfigError(
                    "CreateContainerConfigError", f'{kind.__name__.lower()} "{name}" not found'
                ) from err
            raise
        data: Json = obj.to_dict()
        return data

    async def _key_ref(self, kind: type[Secret] | type[ConfigMap], ref: Json) -> str | None:
        optional = bool(ref.get("optional", False))
        obj = await self._get(kind, ref["name"], optional)
        if obj is None:
            return None
        key = ref["key"]
        if kind is Secret:
            raw = (obj.get("data") or {}).get(key)
            if raw is None:
                raw = (obj.get("stringData") or {}).get(key)
                value = raw
            else:
                value = base64.b64decode(raw).decode()
        else:
            value = (obj.get("data") or {}).get(key)
        if value is None and not optional:
            raise PodConfigError(
                "CreateContainerConfigError",
                f"couldn't find key {key} in {kind.__name__} {self.namespace}/{ref['name']}",
            )
        return value

    def _field(self, path: str) -> str:
        meta = self.pod["metadata"]
        simple = {
            "metadata.name": self.name,
            "metadata.namespace": self.namespace,
            "metadata.uid": self.uid,
            "spec.nodeName": self.kubelet.node_name,
            "spec.serviceAccountName": self.pod["spec"].get("serviceAccountName", ""),
            "status.podIP": self.ip,
            "status.podIPs": self.ip,
            "status.hostIP": "127.0.0.1",
            "status.hostIPs": "127.0.0.1",
        }
        if path in simple:
            return str(simple[path])
        m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if m:
            return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
        raise PodConfigError("CreateContainerConfigError", f"unsupported fieldRef {path}")

    async def environment(self, container: Json) -> dict[str, str]:
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            for kind, key in ((ConfigMap, "configMapRef"), (Secret, "secretRef")):
                if key in source:
                    obj = await self._get(kind, source[key]["name"], bool(source[key].get("optional")))
                    for k, v in ((obj or {}).get("data") or {}).items():
                        env[prefix + k] = base64.b64decode(v).decode() if kind is Secret else v
        for var in container.get("env") or []:
            name = var["name"]
            if "valueFrom" not in var:
                env[name] = expand(var.get("value", ""), env)
                continue
            source = var["valueFrom"]
            value: str | None
            if "secretKeyRef" in source:
                value = await self._key_ref(Secret, source["secretKeyRef"])
            elif "configMapKeyRef" in source:
                value = await self._key_ref(ConfigMap, source["configMapKeyRef"])
            elif "fieldRef" in source:
                value = self._field(source["fieldRef"]["fieldPath"])
            else:
                raise PodConfigError(
                    "CreateContainerConfigError", f"env {name}: unsupported valueFrom {source}"
                )
            if value is not None:
                env[name] = value
        return env

    async def prepare_volumes(self) -> dict[str, Path]:
        """emptyDir, configMap and secret volumes as directories of this pod."""
        paths: dict[str, Path] = {}
        for volume in self.pod["spec"].get("volumes") or []:
            path = self.dir / "volumes" / volume["name"]
            path.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume or "secret" in volume:
                kind: type[Secret] | type[ConfigMap] = ConfigMap if "configMap" in volume else Secret
                ref = volume.get("configMap") or volume.get("secret") or {}
                name = str(ref.get("name") or ref.get("secretName"))
                obj = await self._get(kind, name, bool(ref.get("optional")))
                for k, v in ((obj or {}).get("data") or {}).items():
                    (path / k).write_bytes(base64.b64decode(v) if kind is Secret else v.encode())
            elif "emptyDir" not in volume:
                continue  # projected service-account tokens and the like: nothing to run locally
            os.chmod(path, 0o777)  # like an emptyDir: writable by the container's user
            paths[volume["name"]] = path
        return paths

    async def refresh_volumes(self) -> None:
        """Keep Secret and ConfigMap volumes current, as a kubelet does (a rotated credential reaches the pod)."""
        while True:
            await asyncio.sleep(1.0)
            with contextlib.suppress(PodConfigError, ApiError, httpx2.HTTPError):
                await self.prepare_volumes()

    def command(
        self, container: Json, env: dict[str, str], volumes: dict[str, Path]
    ) -> tuple[list[str], Path]:
        """The argv that runs `container` here, and its working directory."""
        argv = [expand(a, env) for a in (container.get("command") or []) + (container.get("args") or [])]
        if not container.get("command"):
            image = container.get("image", "")
            mapped = self.kubelet.image_commands.get(image)
            if mapped is None:
                raise PodConfigError(
                    "ErrImagePull",
                    f'image "{image}" cannot run on the loopback kubelet: give the container a command, '
                    f"or map the image with --image-command",
                )
            argv = [*mapped, *argv]
        mounts = [
            (volumes[m["name"]], m["mountPath"])
            for m in container.get("volumeMounts") or []
            if m["name"] in volumes
        ]
        # A mount over a directory that holds other sources (/tmp, where the state dir may live) goes last,
        # or it would hide them.
        sources = [str(src) for src, _ in mounts]  # (a list under sort() reads as empty: copy it first)
        mounts.sort(key=lambda mount: any(src.startswith(mount[1].rstrip("/") + "/") for src in sources))
        security = {
            **(self.pod["spec"].get("securityContext") or {}),
            **(container.get("securityContext") or {}),
        }
        uid, gid = security.get("runAsUser"), security.get("runAsGroup")
        if security.get("runAsNonRoot") and uid in (None, 0):
            raise PodConfigError(
                "CreateContainerConfigError", "container has runAsNonRoot and image will run as root"
            )
        if uid is not None and os.geteuid() == 0:
            argv = [
                "setpriv",
                f"--reuid={uid}",
                f"--regid={gid if gid is not None else uid}",
                "--clear-groups",
                *argv,
            ]
        cwd = self.dir
        working_dir = container.get("workingDir")
        if working_dir and not mounts and os.path.isdir(working_dir):
            cwd = Path(working_dir)
        if mounts:
            if os.geteuid() != 0:
                raise PodConfigError(
                    "RunContainerError", "volume mounts need root (a private mount namespace)"
                )
            script = " && ".join(f"mkdir -p {shlex.quote(t)} && mount --bind {shlex.quote(str(s))} {shlex.quote(t)}"
                                 for s, t in mounts)  # fmt: skip
            if working_dir:
                script += f" && mkdir -p {shlex.quote(working_dir)} && cd {shlex.quote(working_dir)}"
            argv = [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                f'{script} && exec "$@"',
                "sh",
                *argv,
            ]
        return argv, cwd

    # --- processes ----------------------------------------------------------------------------------------

    async def start_container(self, run: ContainerRun, volumes: dict[str, Path]) -> None:
        env = await self.environment(run.spec)
        argv, cwd = self.command(run.spec, env, volumes)
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.dir), "HOSTNAME": self.name}
        logfile = (self.dir / f"{run.spec['name']}.log").open("ab")
        try:
            run.process = await asyncio.create_subprocess_exec(
                *argv, env={**base, **env}, cwd=cwd, stdout=logfile, stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        except OSError as err:
            raise PodConfigError("StartError", f"exec {argv[0]}: {err}") from err
        finally:
            logfile.close()
        run.started_at = now()
        run.terminated = None
        log.info("%s: started %s (pid %d) on %s", self.key(), run.spec["name"], run.process.pid, self.ip)

    def _terminated(self, run: ContainerRun, code: int) -> Json:
        # A process killed by signal N reports -N; a container runtime reports 128 + N.
        exit_code = 128 - code if code < 0 else code
        reason = "Completed" if exit_code == 0 else "Error"
        return {"exitCode": exit_code, "reason": reason, "startedAt": run.started_at, "finishedAt": now()}

    async def run(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            await self.stop_processes(0)
            raise
        except Exception:
            log.exception("%s: runner failed", self.key())
            await self.stop_processes(0)

    async def _run(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o777)
        volumes: dict[str, Path] = {}
        while not self.deleting.is_set():  # retry until the config is satisfiable, like a real kubelet
            try:
                volumes = await self.prepare_volumes()
                for run in self.init_containers:
                    await self.start_container(run, volumes)
                    await self.report()
                    if run.spec.get("restartPolicy") == "Always":
                        continue  # a native sidecar: it runs beside the containers, not before them
                    assert run.process is not None
                    code = await self._wait_or_delete(run.process)
                    if code is None:
                        return await self.finish_deletion()
                    run.terminated = self._terminated(run, code)
                    if code != 0:
                        self.phase = "Failed"
                        await self.report()
                        return await self._wait_deleted()
                self.initialized = True
                for run in self.containers:
                    await self.start_container(run, volumes)
                self.config_error = None
                break
            except PodConfigError as err:
                self.config_error = err
                log.info("%s: %s: %s", self.key(), err.reason, err.message)
                await self.report()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.deleting.wait(), 1.0)
        if self.deleting.is_set():
            return await self.finish_deletion()
        self.phase = "Running"
        await self.report()
        watchers = [asyncio.create_task(self.supervise(run, volumes)) for run in self.containers]
        refresher = asyncio.create_task(self.refresh_volumes())
        probes = [asyncio.create_task(self.probe(run)) for run in self.containers]
        deletion: asyncio.Future[Any] = asyncio.ensure_future(self.deleting.wait())
        exits: asyncio.Future[Any] = asyncio.gather(*watchers)
        exits.add_done_callback(
            lambda f: f.cancelled() or f.exception()
        )  # retrieved: no "never retrieved" noise
        try:
            await asyncio.wait([exits, deletion], return_when=asyncio.FIRST_COMPLETED)
        finally:
            refresher.cancel()
            for task in probes:
                task.cancel()
        if self.deleting.is_set():
            for task in watchers:
                task.cancel()
            return await self.finish_deletion()
        deletion.cancel()
        await self.stop_sidecars()
        codes = [r.terminated["exitCode"] for r in self.containers if r.terminated]
        self.phase = "Succeeded" if all(c == 0 for c in codes) else "Failed"
        for run in self.containers:
            run.ready = False
        await self.report()
        log.info("%s: %s (exit codes %s)", self.key(), self.phase, codes)
        await self._wait_deleted()

    async def _wait_or_delete(self, process: asyncio.subprocess.Process) -> int | None:
        """The exit code, or None when the pod is being deleted first (the process is then stopped)."""
        waiter = asyncio.create_task(process.wait())
        deletion = asyncio.create_task(self.deleting.wait())
        await asyncio.wait([waiter, deletion], return_when=asyncio.FIRST_COMPLETED)
        deletion.cancel()
        if waiter.done():
            return waiter.result()
        waiter.cancel()
        await self.stop_processes(self.grace_seconds)
        return None

    async def supervise(self, run: ContainerRun, volumes: dict[str, Path]) -> None:
        """Wait for the container to exit; restart it per restartPolicy, with backoff."""
        while True:
            assert run.process is not None
            code = await run.process.wait()
            run.ready = False
            state = self._terminated(run, code)
            restart = self.restart_policy == "Always" or (self.restart_policy == "OnFailure" and code != 0)
            if not restart:
                run.terminated = state
                await self.report()
                return
            run.last_terminated = state
            run.restart_count += 1
            run.waiting = {"reason": "CrashLoopBackOff" if code != 0 else "Completed"}
            run.process = None
            await self.report()
            await asyncio.sleep(min(RESTART_BACKOFF_CAP, 2 ** (run.restart_count - 1)))
            await self.start_container(run, volumes)
            await self.report()

    async def probe(self, run: ContainerRun) -> None:
        spec = run.spec.get("readinessProbe")
        if not spec:
            run.ready = True
            await self.report()
            return
        await asyncio.sleep(float(spec.get("initialDelaySeconds", 0)))
        period = max(1.0, float(spec.get("periodSeconds", 10)))
        success_threshold = int(spec.get("successThreshold", 1))
        failure_threshold = int(spec.get("failureThreshold", 3))
        successes = failures = 0
        while True:
            ok = await self.check(run, spec)
            successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
            ready = run.ready
            if successes >= success_threshold:
                ready = True
            elif failures >= failure_threshold:
                ready = False
            if ready != run.ready:
                run.ready = ready
                await self.report()
            await asyncio.sleep(period if run.ready or successes else min(period, 0.2))

    def _port(self, run: ContainerRun, port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in run.spec.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"no port named {port}")

    async def check(self, run: ContainerRun, spec: Json) -> bool:
        timeout = float(spec.get("timeoutSeconds", 1))
        try:
            if "httpGet" in spec:
                get = spec["httpGet"]
                url = f"{get.get('scheme', 'HTTP').lower()}://{get.get('host') or self.ip}:{self._port(run, get['port'])}{get.get('path', '/')}"
                async with httpx.AsyncClient(timeout=timeout, verify=False) as http:
                    response = await http.get(url)
                return 200 <= response.status_code < 400
            if "tcpSocket" in spec:
                port = self._port(run, spec["tcpSocket"]["port"])
                _, writer = await asyncio.wait_for(asyncio.open_connection(self.ip, port), timeout)
                writer.close()
                return True
            if "exec" in spec:
                proc = await asyncio.create_subprocess_exec(
                    *spec["exec"]["command"], cwd=self.dir, stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )  # fmt: skip
                return await asyncio.wait_for(proc.wait(), timeout) == 0
        except (OSError, httpx.HTTPError, TimeoutError, ValueError):
            return False
        return False

    async def stop_sidecars(self) -> None:
        """The main containers are done: native sidecars end with them."""
        for run in self.init_containers:
            if run.spec.get("restartPolicy") == "Always" and run.process and run.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.process.pid, signal.SIGTERM)
                code = await run.process.wait()
                run.terminated = self._terminated(run, code)

    async def stop_processes(self, grace: float) -> None:
        runs = [
            r for r in self.init_containers + self.containers if r.process and r.process.returncode is None
        ]
        for run in runs:
            assert run.process is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.process.pid, signal.SIGTERM)
        for run in runs:
            assert run.process is not None
            try:
                code = await asyncio.wait_for(run.process.wait(), grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.process.pid, signal.SIGKILL)
                code = await run.process.wait()
            run.terminated = self._terminated(run, code)

    async def _wait_deleted(self) -> None:
        await self.deleting.wait()
        await self.finish_deletion()

    async def finish_deletion(self) -> None:
        """What the kubelet does once a pod's containers are stopped: remove the object for good."""
        await self.stop_processes(self.grace_seconds)
        if self.phase not in ("Succeeded", "Failed"):
            self.phase = (
                "Failed"
                if any(r.terminated and r.terminated["exitCode"] for r in self.containers)
                else "Succeeded"
            )
        with contextlib.suppress(ApiError):
            await self.report()
        try:
            await self.client.delete(Pod, self.name, namespace=self.namespace, grace_period=0)
        except ApiError as err:
            if err.status.code != 404:
                log.warning("deleting %s: %s", self.key(), err)
        log.info("%s: deleted", self.key())


class LoopbackKubelet:
    def __init__(
        self, client: AsyncClient, state_dir: Path, node_name: str = NODE_NAME,
        image_commands: dict[str, list[str]] | None = None,
    ) -> None:  # fmt: skip
        self.client = client
        self.state_dir = state_dir
        self.node_name = node_name
        self.image_commands = image_commands or {}
        self.addresses = AddressPool()
        self.runners: dict[str, PodRunner] = {}
        self.labels = {**NODE_LABELS, "kubernetes.io/hostname": node_name}

    async def register(self) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name, "labels": self.labels},
            "spec": {},
        }
        try:
            await self.client.create(Node.from_dict(node))  # type: ignore[call-overload]
        except ApiError as err:
            if err.status.code != 409:
                raise
        await self.heartbeat()

    async def heartbeat(self) -> None:
        capacity = {
            "cpu": str(os.cpu_count() or 2),
            "memory": "24Gi",
            "pods": "1000",
            "ephemeral-storage": "100Gi",
        }
        status = {
            "capacity": capacity,
            "allocatable": capacity,
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.node_name},
            ],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "loopback kubelet is posting ready status",
                    "lastHeartbeatTime": now(),
                    "lastTransitionTime": now(),
                }
            ],
            "nodeInfo": {
                "machineID": "loopback", "systemUUID": "loopback", "bootID": "loopback",
                "kernelVersion": os.uname().release, "osImage": "loopback", "containerRuntimeVersion": "loopback://1",
                "kubeletVersion": "v1.36.3", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
            },
        }  # fmt: skip
        await self.client.patch(NodeStatus, self.node_name, {"status": status})

    async def heartbeats(self) -> None:
        while True:
            await asyncio.sleep(20)
            with contextlib.suppress(ApiError, httpx2.HTTPError):
                await self.heartbeat()

    def schedulable(self, pod: Json) -> bool:
        selector = pod["spec"].get("nodeSelector") or {}
        return all(self.labels.get(k) == v for k, v in selector.items())

    async def schedule(self) -> None:
        """Bind every pending, unbound pod that fits this node."""
        async for _, obj in self._watch({"spec.nodeName": ""}):
            pod = obj.to_dict()
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            if not self.schedulable(pod):
                condition = {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.",
                    "lastTransitionTime": now(),
                }
                with contextlib.suppress(ApiError):
                    await self.client.patch(
                        PodStatus,
                        meta["name"],
                        {"status": {"conditions": [condition]}},
                        namespace=meta["namespace"],
                    )
                continue
            binding = PodBinding.from_dict(
                {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
                }
            )
            try:
                await self.client.create(binding, meta["name"], namespace=meta["namespace"])  # type: ignore[call-overload]
            except msgspec.ValidationError:
                pass  # bound: the API answers a binding with a Status, which lightkube fails to decode as a Binding
            except ApiError as err:
                if err.status.code not in (404, 409):
                    log.warning("binding %s/%s: %s", meta["namespace"], meta["name"], err)

    async def run_pods(self) -> None:
        async for op, obj in self._watch({"spec.nodeName": self.node_name}):
            pod = obj.to_dict()
            uid = pod["metadata"]["uid"]
            runner = self.runners.get(uid)
            if op == "DELETED":
                if runner is not None:
                    runner.deleting.set()
                    runner.grace_seconds = 0
                continue
            if runner is None:
                if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") or pod["metadata"].get(
                    "deletionTimestamp"
                ):
                    # a pod of an earlier kubelet life (or finished before we saw it): only finish deleting it
                    if pod["metadata"].get("deletionTimestamp"):
                        with contextlib.suppress(ApiError):
                            await self.client.delete(
                                Pod,
                                pod["metadata"]["name"],
                                namespace=pod["metadata"]["namespace"],
                                grace_period=0,
                            )
                    continue
                runner = PodRunner(self, pod)
                self.runners[uid] = runner
                runner.task = asyncio.create_task(runner.run())
                runner.task.add_done_callback(self._forget(uid))
            elif pod["metadata"].get("deletionTimestamp"):
                grace = pod["metadata"].get("deletionGracePeriodSeconds")
                if grace is not None:
                    runner.grace_seconds = float(grace)
                runner.deleting.set()

    def _forget(self, uid: str) -> Any:
        return lambda _task: self.runners.pop(uid, None)

    async def _watch(self, fields: dict[str, Any]) -> Any:
        """Watch pods, reconnecting (and so relisting) whenever the stream ends or fails."""
        while True:
            try:
                async for op, obj in self.client.watch(Pod, namespace=ALL_NS, fields=fields):
                    yield op, obj
            except (ApiError, httpx2.HTTPError) as err:
                log.warning("pod watch %s: %s; reconnecting", fields, err)
                await asyncio.sleep(0.5)

    async def shutdown(self) -> None:
        runners = list(self.runners.values())
        await asyncio.gather(*(r.stop_processes(2) for r in runners), return_exceptions=True)
        for r in runners:
            if r.task:
                r.task.cancel()


async def main_async(args: argparse.Namespace) -> None:
    config = KubeConfig.from_file(args.kubeconfig)
    client = AsyncClient(config, field_manager="loopback-kubelet", timeout=httpx2.Timeout(30, read=None))
    image_commands = {k: shlex.split(v) for k, v in (item.split("=", 1) for item in args.image_command)}
    kubelet = LoopbackKubelet(client, Path(args.state_dir), args.node_name, image_commands)
    await kubelet.register()
    log.info("node %s registered", args.node_name)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks: list[asyncio.Task[Any]] = [
        asyncio.create_task(c) for c in (kubelet.schedule(), kubelet.run_pods(), kubelet.heartbeats())
    ]
    stopping: asyncio.Task[Any] = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([*tasks, stopping], return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        task.cancel()
    await kubelet.shutdown()
    for task in done:
        if task is not stopping and task.exception():
            raise task.exception()  # type: ignore[misc]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--node-name", default=NODE_NAME)
    parser.add_argument("--image-command", action="append", default=[], metavar="IMAGE=COMMAND",
                        help="run containers of IMAGE that have no command as COMMAND")  # fmt: skip
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
