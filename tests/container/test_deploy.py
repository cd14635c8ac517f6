#!/usr/bin/python3
"""The deployment files agree with each other and with what the image does.

`kubectl apply --dry-run=client` needs a cluster-less kubectl, which these
machines lack; this checks the structure that matters instead: selectors
reach the pods, probes hit /health on the container's port, the GPU is a
resource limit, the grace periods let a drain finish, the compose service
and the Dockerfile expose and probe the same port. Exit 77 (skip) without
PyYAML (Debian: python3-yaml).
"""
import glob
import json
import os
import re
import sys

try:
    import yaml
except ImportError:
    print("SKIP: PyYAML missing (apt-get install python3-yaml)")
    sys.exit(77)

SRC = os.environ.get("KDA_SRC") or os.path.join(os.path.dirname(__file__), "..", "..")
DEPLOY = os.path.join(SRC, "deploy")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    print(("ok    " if cond else "FAIL  ") + what)


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def dockerfile():
    with open(os.path.join(SRC, "Dockerfile")) as f:
        text = f.read()
    # Join continuation lines so every instruction is one line.
    return re.sub(r"\\\n", " ", text)


def grace_seconds(env):
    for e in env:
        if e["name"] == "KDA_GRACE_SECONDS":
            return int(e["value"])
    return None


def test_dockerfile():
    df = dockerfile()
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", df, re.M | re.I)
    check(len(stages) >= 2, "Dockerfile: multi-stage (build + runtime)")
    check(all(img.startswith("${") for img, _ in stages), "Dockerfile: every base image is a build argument")
    args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", df, re.M))
    check("cuda" in args.get("BUILD_IMAGE", "") and "devel" in args.get("BUILD_IMAGE", ""),
          "Dockerfile: default build image is a CUDA devel image")
    check("cuda" in args.get("RUNTIME_IMAGE", "") and "runtime" in args.get("RUNTIME_IMAGE", ""),
          "Dockerfile: default runtime image is a CUDA runtime image")
    final = df[df.rfind("\nFROM"):]
    users = re.findall(r"^USER\s+(\S+)", final, re.M)
    check(bool(users) and users[-1].split(":")[0].isdigit() and users[-1].split(":")[0] != "0",
          "Dockerfile: runtime stage ends as a numeric non-root USER")
    check(not re.search(r"^RUN .*\b(meson|ninja|gcc)\b", final, re.M),
          "Dockerfile: no compiler runs in the runtime stage")
    expose = re.findall(r"^EXPOSE\s+(\d+)", final, re.M)
    check(expose == ["8080"], "Dockerfile: EXPOSE 8080")
    env_port = re.search(r"KDA_PORT=(\d+)", final)
    check(env_port is not None and env_port.group(1) == "8080", "Dockerfile: KDA_PORT default matches EXPOSE")
    hc = re.search(r"^HEALTHCHECK .*CMD (.*)$", final, re.M)
    check(hc is not None and "/health" in hc.group(1), "Dockerfile: HEALTHCHECK probes /health")
    ep = re.search(r"^ENTRYPOINT\s+(.*)$", final, re.M)
    exec_form = None
    if ep:
        try:
            exec_form = json.loads(ep.group(1))
        except ValueError:
            pass
    check(isinstance(exec_form, list) and exec_form[0].startswith("/"),
          "Dockerfile: ENTRYPOINT in exec form (no /bin/sh -c wrapping PID 1)")
    check(re.search(r"^COPY\s+deploy/entrypoint.sh\s", final, re.M) is not None,
          "Dockerfile: the entrypoint is deploy/entrypoint.sh")
    check(re.search(r"^COPY\s+models/demo/?\s", final, re.M) is not None, "Dockerfile: demo model baked in")
    check(re.search(r"^VOLUME\s+/models", final, re.M) is not None, "Dockerfile: /models is a volume")
    with open(os.path.join(SRC, ".dockerignore")) as f:
        ign = f.read().split("\n")
    # Everything the Dockerfile COPYs from the context must be let through.
    for need in ("deploy/entrypoint.sh", "deploy/runtime-packages.sh", "models/demo/", "engine/", "server/"):
        check("!" + need in ign, f".dockerignore lets {need} into the context")


def test_compose():
    (c,) = load_all(os.path.join(DEPLOY, "compose.yaml"))
    svc = c["services"]["kda-server"]
    check(any(str(p).endswith(":8080") for p in svc["ports"]), "compose: publishes container port 8080")
    # "${VAR:-default}:/models:ro": drop the substitution before splitting on ':'.
    targets = [re.sub(r"\$\{[^}]*\}", "HOST", str(v)).split(":")[1] for v in svc["volumes"]]
    check("/models" in targets, "compose: model volume on /models")
    devs = svc["deploy"]["resources"]["reservations"]["devices"]
    check(any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devs),
          "compose: reserves an NVIDIA GPU")
    grace = int(svc["environment"]["KDA_GRACE_SECONDS"])
    stop = int(re.fullmatch(r"(\d+)s", svc["stop_grace_period"]).group(1))
    check(stop > grace, "compose: stop_grace_period outlasts KDA_GRACE_SECONDS")
    check(svc["build"]["context"] == ".." and
          os.path.exists(os.path.join(DEPLOY, svc["build"]["context"], svc["build"]["dockerfile"])),
          "compose: build context is the repo root with its Dockerfile")


def test_kubernetes():
    docs = []
    for path in sorted(glob.glob(os.path.join(DEPLOY, "k8s", "*.yaml"))):
        for d in load_all(path):
            check(isinstance(d, dict) and "apiVersion" in d and "kind" in d,
                  f"k8s: {os.path.basename(path)} documents have apiVersion and kind")
            docs.append((os.path.basename(path), d))
    by_kind = {}
    for name, d in docs:
        by_kind.setdefault(d["kind"], []).append(d)

    kust = by_kind.get("Kustomization", [{}])[0]
    listed = set(kust.get("resources", []))
    files = {n for n, d in docs if d["kind"] != "Kustomization"}
    check(listed == files, "k8s: kustomization.yaml lists every manifest")

    (dep,) = by_kind["Deployment"]
    check(dep["apiVersion"] == "apps/v1", "k8s: Deployment is apps/v1")
    check(dep["spec"]["replicas"] >= 2, "k8s: several replicas")
    pod = dep["spec"]["template"]
    sel = dep["spec"]["selector"]["matchLabels"]
    labels = pod["metadata"]["labels"]
    check(all(labels.get(k) == v for k, v in sel.items()), "k8s: Deployment selector matches its pod labels")
    spec = pod["spec"]
    (ctr,) = spec["containers"]
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    check(ports.get("http") == 8080, "k8s: container port http = 8080 (the image's EXPOSE)")

    def probe_ok(kind):
        p = ctr.get(kind, {}).get("httpGet", {})
        port = p.get("port")
        return p.get("path") == "/health" and (port == "http" or port == ports.get("http"))

    for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
        check(probe_ok(kind), f"k8s: {kind} is GET /health on the http port")
    limits = ctr["resources"]["limits"]
    requests = ctr["resources"]["requests"]
    check(int(limits.get("nvidia.com/gpu", 0)) >= 1, "k8s: nvidia.com/gpu in the limits")
    check(requests.get("nvidia.com/gpu", limits.get("nvidia.com/gpu")) == limits.get("nvidia.com/gpu"),
          "k8s: GPU request equals limit (extended resources cannot overcommit)")
    check("memory" in limits, "k8s: memory limit set")

    sc = spec.get("securityContext", {})
    check(sc.get("runAsNonRoot") is True and int(sc.get("runAsUser", 0)) != 0, "k8s: pod runs as non-root")
    csc = ctr.get("securityContext", {})
    check(csc.get("allowPrivilegeEscalation") is False and "ALL" in csc.get("capabilities", {}).get("drop", []),
          "k8s: no privilege escalation, capabilities dropped")

    grace = grace_seconds(ctr["env"])
    pre = ctr.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    pre_s = int(pre[1]) if len(pre) == 2 and pre[0] == "sleep" else 0
    check(grace is not None and spec["terminationGracePeriodSeconds"] > grace + pre_s,
          "k8s: terminationGracePeriodSeconds outlasts preStop + KDA_GRACE_SECONDS")

    mounts = {m["name"]: m["mountPath"] for m in ctr["volumeMounts"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    check(set(mounts) <= set(vols), "k8s: every volumeMount has a volume")
    check(mounts.get("models") == "/models", "k8s: models volume mounted on /models")
    pvcs = {d["metadata"]["name"] for d in by_kind.get("PersistentVolumeClaim", [])}
    claim = vols.get("models", {}).get("persistentVolumeClaim", {}).get("claimName")
    check(claim in pvcs, "k8s: the models volume's claim is defined")
    env = {e["name"]: e for e in ctr["env"]}
    key_file = env.get("KDA_API_KEY_FILE", {}).get("value", "")
    check(any(key_file.startswith(m.rstrip("/") + "/") for m in mounts.values()),
          "k8s: KDA_API_KEY_FILE lies in a mounted volume")
    if ctr.get("securityContext", {}).get("readOnlyRootFilesystem"):
        check("/tmp" in mounts.values(), "k8s: read-only root has a writable /tmp")

    (svc,) = by_kind["Service"]
    check(svc["spec"]["selector"] == sel or all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()),
          "k8s: Service selector reaches the Deployment's pods")
    tps = [p["targetPort"] for p in svc["spec"]["ports"]]
    check(all(t in ports or t in ports.values() for t in tps), "k8s: Service targetPort is the container port")
    for pdb in by_kind.get("PodDisruptionBudget", []):
        check(all(labels.get(k) == v for k, v in pdb["spec"]["selector"]["matchLabels"].items()),
              "k8s: PodDisruptionBudget selects the Deployment's pods")


def main():
    test_dockerfile()
    test_compose()
    test_kubernetes()
    print(f"{len(failures)} failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
