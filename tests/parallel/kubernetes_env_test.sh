#!/usr/bin/env bash
# Kubernetes, as far as a machine without a cluster can go: the pods of
# deploy/kubernetes/tide-job.yaml, each a host of its own (netns_hosts.sh) named as the
# headless Service names it (tide-llama-i.tide-llama, through the host's /etc/hosts), run
# the manifest's command with exactly the environment Kubernetes gives them: the
# container's env and the Indexed Job's JOB_COMPLETION_INDEX and HOSTNAME. Only the
# recipe, the run directory and the device are the test's. Two pods give one process's
# losses and parameters within 1e-5.
# Skipped (exit 77) where network namespaces cannot be made (not root, no iproute2).
source "$(dirname "$0")/common.sh" "$1"
source "$(dirname "$0")/netns_hosts.sh"
manifest=$(cd "$(dirname "$0")/../../deploy/kubernetes" && pwd)/tide-job.yaml
trap 'remove_hosts; rm -rf "$work"' EXIT
make_hosts || exit 77

# Pod k's environment and command line, one item per line: what the manifest gives it, the
# recipe, run directory and device replaced, the data path dropped (the test recipe has its own).
pod() {  # pod K
  "${TIDE_PYTHON:-python3}" - "$manifest" "$1" "$tide" "$work/llama.lua" "$work/k8s" <<'PY'
import sys, yaml
manifest, k, tide, recipe, run_dir = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
service, job = list(yaml.safe_load_all(open(manifest)))
spec = job["spec"]
assert spec["completionMode"] == "Indexed", spec
pod = spec["template"]["spec"]
assert pod["subdomain"] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
(container,) = pod["containers"]
env = {e["name"]: e["value"] for e in container["env"]}
assert int(env["WORLD_SIZE"]) == spec["completions"] == spec["parallelism"], (env, spec)
assert "RANK" not in env, "the rank is the completion index"
env["JOB_COMPLETION_INDEX"] = str(k)  # what Kubernetes adds to an Indexed Job's pods
env["HOSTNAME"] = f"{job['metadata']['name']}-{k}"
cmd = container["command"]
assert cmd[:2] == ["tide", "train"], cmd
args = [tide, "train", recipe]
rest, i = cmd[3:], 0
while i < len(rest):
    opt = rest[i]
    if opt not in ("--set", "--resume", "--run-dir"):
        args.append(opt)
        i += 1
        continue
    value = rest[i + 1]
    i += 2
    if opt == "--run-dir":
        value = run_dir
    elif value.startswith("data.path="):
        continue
    elif value.startswith("device="):
        value = "device=cpu"
    args += [opt, value]
for name, value in env.items():
    print(f"{name}={value}")
print("--")
print("\n".join(args))
PY
}

# The names the headless Service gives the pods.
name_hosts "tide-llama-0.tide-llama" "tide-llama-1.tide-llama"
train llama llama-1
pids=()
for k in 0 1; do
  mapfile -t spec < <(pod $k)
  sep=0
  while [[ ${spec[$sep]} != -- ]]; do sep=$((sep + 1)); done
  ip netns exec "${hosts[$k]}" env -i PATH="$PATH" "${spec[@]:0:$sep}" "${spec[@]:$((sep + 1))}" --quiet \
    2> "$work/pod$k.log" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
(( status == 0 )) || { cat "$work/pod0.log" "$work/pod1.log"; fail "the two pods"; }
grep -q "rank 0 of 2 (set by WORLD_SIZE and JOB_COMPLETION_INDEX (a Kubernetes Indexed Job)), rendezvous at tide-llama-0.tide-llama:29500" \
  "$work/pod0.log" || { cat "$work/pod0.log"; fail "pod 0 does not say where its rank came from"; }
compare "$work/llama-1" "$work/k8s" 0 || fail "two pods differ from one process"
echo "kubernetes environment: ok"
