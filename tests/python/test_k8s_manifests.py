"""The Kubernetes manifests in docker/k8s, checked without a cluster:

1. every manifest a kustomization lists validates (strict: unknown fields are errors) against
   the Kubernetes JSON schemas that the kubernetes-validate package ships (offline), for the
   oldest version we claim (1.29) and the newest the package has;
2. what the manifests tell the server is what the real binary understands: each --flag in the
   container's args and each ATTNRES_* env var is an `attnres serve` flag; the server starts
   with that configuration, and the probe paths and the Prometheus scrape path answer on it,
   with the metric the HPA scales on (through the prometheus-adapter rule) among /metrics;
3. the pod's terminationGracePeriodSeconds covers the preStop sleep plus the drain
   (--grace-period, or its default).
"""

import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from server_process import ServerProcess

K8S = Path(__file__).resolve().parents[2] / "docker" / "k8s"
KUSTOMIZATIONS = [K8S / "kustomization.yaml", K8S / "base" / "kustomization.yaml",
                  K8S / "autoscaling" / "kustomization.yaml"]
ADAPTER_VALUES = K8S / "autoscaling" / "prometheus-adapter-values.yaml"
OLDEST_K8S = "1.29"
K8S_VERSIONS = [OLDEST_K8S, kubernetes_validate.latest_version()]


def load_yaml(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def listed_files(kustomization: Path) -> list[Path]:
    """The resource files a kustomization lists, following directory entries (bases)."""
    files = []
    for entry in yaml.safe_load(kustomization.read_text()).get("resources", []):
        path = (kustomization.parent / entry).resolve()
        if path.is_dir():
            files += listed_files(path / "kustomization.yaml")
        else:
            assert path.is_file(), f"{kustomization}: lists {entry}, which does not exist"
            files.append(path)
    return files


def all_manifest_files() -> list[Path]:
    return sorted({f for k in KUSTOMIZATIONS for f in listed_files(k)})


def resources() -> dict[str, dict]:
    """kind -> the one resource of that kind across the manifests."""
    out: dict[str, dict] = {}
    for path in all_manifest_files():
        for doc in load_yaml(path):
            assert doc["kind"] not in out, f"two {doc['kind']} resources"
            out[doc["kind"]] = doc
    return out


def container() -> dict:
    containers = resources()["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_values(c: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def arg_flags(c: dict) -> dict[str, str | None]:
    """--flag -> its value (None for a switch) from the container's args."""
    args = [str(a) for a in c.get("args", [])]
    out: dict[str, str | None] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if eq:
                out[name] = value
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                out[name] = args[i + 1]
            else:
                out[name] = None
    return out


def probes(c: dict) -> dict[str, dict]:
    return {k: c[k] for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in c}


def container_port(c: dict, port) -> int:
    """A probe's or Service's port (a number or a container port's name) as a number."""
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in c["ports"] if "name" in p}
    assert port in named, f"port {port!r} names no container port ({sorted(named)})"
    return named[port]


def serve_help(attnres_bin) -> str:
    assert Path(attnres_bin).exists(), f"attnres binary not found at {attnres_bin}: build first"
    return subprocess.run([str(attnres_bin), "serve", "--help"], capture_output=True, text=True,
                          check=True).stdout


def serve_flags(attnres_bin) -> set[str]:
    return set(re.findall(r"^\s+--([a-z0-9-]+)", serve_help(attnres_bin), flags=re.M))


# --- 1. schemas -------------------------------------------------------------------------------

def test_every_manifest_file_is_in_a_kustomization():
    listed = set(all_manifest_files())
    on_disk = {p.resolve() for p in K8S.rglob("*.yaml")
               if p.name != "kustomization.yaml" and p != ADAPTER_VALUES}
    assert on_disk - listed == set(), "manifests no kustomization lists"
    assert {"Deployment", "Service", "PersistentVolumeClaim", "PodDisruptionBudget",
            "HorizontalPodAutoscaler"} <= set(resources())


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", all_manifest_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_manifest_validates_against_the_kubernetes_schema(path, version):
    for doc in load_yaml(path):
        error = None
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = ".".join(str(p) for p in e.path)
            error = f"{doc['kind']} invalid for Kubernetes {version}: {where}: {e.message}"
        except kubernetes_validate.SchemaNotFoundError as e:
            error = e.message
        if error:
            pytest.fail(f"{path.name}: {error}")


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_autoscaling_overlay_patch_applies_and_validates(version):
    """The overlay removes the Deployment's replicas (the HPA owns them): the patch targets
    the Deployment by name, the path exists, and the patched Deployment still validates."""
    overlay = yaml.safe_load((K8S / "autoscaling" / "kustomization.yaml").read_text())
    deployment = resources()["Deployment"]
    (patch,) = overlay["patches"]
    assert patch["target"]["kind"] == "Deployment"
    assert patch["target"]["name"] == deployment["metadata"]["name"]
    (op,) = yaml.safe_load(patch["patch"])
    assert op == {"op": "remove", "path": "/spec/replicas"}
    assert "replicas" in deployment["spec"]
    patched = {**deployment, "spec": {k: v for k, v in deployment["spec"].items()
                                      if k != "replicas"}}
    kubernetes_validate.validate(patched, version, strict=True)


@pytest.mark.parametrize("entry", ["", "autoscaling"])
def test_kustomize_builds_and_the_output_validates(entry):
    """What `kubectl apply -k` would apply, rendered by kubectl's own kustomize (optional:
    kubectl is not a test dependency; the tests above check the same files without it)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    out = subprocess.run([kubectl, "kustomize", str(K8S / entry)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    expected = sorted(["Deployment", "Service", "PersistentVolumeClaim", "PodDisruptionBudget"]
                      + (["HorizontalPodAutoscaler"] if entry else []))
    assert kinds == expected
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert ("replicas" in deployment["spec"]) == (not entry), "the HPA must own the replicas"
    for doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_resources_refer_to_each_other():
    r = resources()
    deployment, service, pdb, hpa = (r["Deployment"], r["Service"], r["PodDisruptionBudget"],
                                     r["HorizontalPodAutoscaler"])
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    c = container()
    for name, selector in [("Deployment", deployment["spec"]["selector"]["matchLabels"]),
                           ("Service", service["spec"]["selector"]),
                           ("PodDisruptionBudget", pdb["spec"]["selector"]["matchLabels"])]:
        assert selector.items() <= labels.items(), f"{name} selector does not match the pods"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert service["spec"]["type"] == "ClusterIP"
    service_ports = {container_port(c, p["targetPort"]) for p in service["spec"]["ports"]}
    assert service_ports == {p["containerPort"] for p in c["ports"]}
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]
              if "persistentVolumeClaim" in v}
    assert claims == {r["PersistentVolumeClaim"]["metadata"]["name"]}
    models = [m for m in c["volumeMounts"] if m["mountPath"] == "/models"]
    assert models and models[0]["readOnly"] is True
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


# --- 2. the manifests against the real binary ------------------------------------------------

def test_every_flag_and_attnres_variable_is_a_serve_flag(attnres_bin):
    flags = serve_flags(attnres_bin)
    c = container()
    for flag in arg_flags(c):
        assert flag in flags, f"deployment.yaml args: --{flag} is not an `attnres serve` flag"
    names = [n for n in env_values(c) if n.startswith("ATTNRES_")]
    assert "ATTNRES_MODEL" in names
    for name in names:
        flag = name[len("ATTNRES_"):].lower().replace("_", "-")
        assert flag in flags, f"deployment.yaml env: {name} matches no `attnres serve --{flag}`"


def test_container_ports_are_the_ports_the_server_listens_on():
    c, env = container(), env_values(container())
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": int(env["ATTNRES_PORT"]), "grpc": int(env["ATTNRES_GRPC_PORT"])}
    assert env["ATTNRES_HOST"] == "0.0.0.0", "the server must listen beyond 127.0.0.1 in a pod"
    annotations = resources()["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == ports["http"]
    for kind, probe in probes(c).items():
        assert container_port(c, probe["httpGet"]["port"]) == ports["http"], kind


def adapter_rule() -> dict:
    (rule,) = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]
    return rule


def test_hpa_metric_is_the_adapter_rules_name():
    rule = adapter_rule()
    (metric,) = resources()["HorizontalPodAutoscaler"]["spec"]["metrics"]
    assert metric["type"] == "Pods"
    name = metric["pods"]["metric"]["name"]
    assert name == rule["name"]["as"]
    # The schema takes any string for a quantity; the API server would not.
    assert re.fullmatch(r"\d+(\.\d+)?(m|k|M|G|Ki|Mi|Gi)?",
                        str(metric["pods"]["target"]["averageValue"]))
    assert re.fullmatch(r"[a-z0-9_]+", name), "':' is not valid in a custom metrics API name"
    series = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)", rule["seriesQuery"]).group(1)
    assert re.fullmatch(rule["name"]["matches"], series)
    overrides = rule["resources"]["overrides"]
    assert sorted(v["resource"] for v in overrides.values()) == ["namespace", "pod"]
    assert "<<.Series>>{<<.LabelMatchers>>}" in rule["metricsQuery"]


def test_server_runs_with_the_manifest_configuration(attnres_bin):
    """Starts the real server with the Deployment's args and env (the built-in demo model on
    the CPU, local ports: the only substitutions), then fetches every probe path and the
    scrape path as the kubelet and Prometheus would."""
    c = container()
    args = [str(a) for a in c.get("args", [])]
    if "--device" in args:
        args[args.index("--device") + 1] = "cpu"
    env = {k: v for k, v in env_values(c).items() if v is not None}
    env.pop("ATTNRES_MODEL")  # no model volume here: the built-in demo model
    env["ATTNRES_HOST"] = "127.0.0.1"
    env["ATTNRES_KV_CACHE_MEMORY"] = "256MiB"
    # ServerProcess passes --port / --grpc-port (free ports), which win over ATTNRES_PORT.
    with ServerProcess(attnres_bin, *args, env=env) as server:
        for kind, probe in probes(c).items():
            get = probe["httpGet"]
            assert get.get("scheme", "HTTP") == "HTTP"
            with urllib.request.urlopen(server.http_url + get["path"], timeout=10) as r:
                assert r.status == 200, f"{kind} {get['path']}"
        annotations = resources()["Deployment"]["spec"]["template"]["metadata"]["annotations"]
        with urllib.request.urlopen(server.http_url + annotations["prometheus.io/path"],
                                    timeout=10) as r:
            assert r.status == 200
            metrics = r.read().decode()
        series = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", adapter_rule()["seriesQuery"]).group(0)
        assert series == "attnres:num_requests_waiting"
        # A gauge: the HPA averages its current value over the pods.
        assert re.search(rf"^# TYPE {re.escape(series)} gauge$", metrics, flags=re.M)
        assert re.search(rf"^{re.escape(series)}{{.*}} \d", metrics, flags=re.M)


# --- 3. termination --------------------------------------------------------------------------

def test_termination_grace_period_covers_the_drain(attnres_bin):
    c = container()
    grace = arg_flags(c).get("grace-period") or env_values(c).get("ATTNRES_GRACE_PERIOD")
    if grace is None:
        grace = re.search(r"--grace-period .*\(default (\d+)\)", serve_help(attnres_bin)).group(1)
    pre_stop = 0
    command = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
    if command:
        assert command[0] == "sleep", "only a preStop sleep is accounted for here"
        pre_stop = int(command[1])
    pod = resources()["Deployment"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > int(grace) + pre_stop, (
        f"terminationGracePeriodSeconds {pod['terminationGracePeriodSeconds']} must exceed the "
        f"preStop sleep ({pre_stop} s) + --grace-period ({grace} s), else SIGKILL cuts the drain")


def test_liveness_probe_is_slow_to_kill():
    """A busy server must not be restarted: the liveness probe allows at least a minute of
    failures, and waits at least as long per attempt as the readiness probe."""
    p = probes(container())
    live, ready = p["livenessProbe"], p["readinessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= 60
    assert live.get("timeoutSeconds", 1) >= ready.get("timeoutSeconds", 1)
    assert "startupProbe" in p, "a model load longer than the liveness budget needs one"
