#!/usr/bin/python3
"""Runs a command under an OCI seccomp profile (the JSON that podman, CRI-O and containerd use),
evaluated for a capability set, as a container runtime would apply it: then execs the command.

    oci-seccomp-exec.py --profile seccomp.json --caps CAP_BPF,CAP_NET_ADMIN \
        [--gate-bpf-on-cap-bpf] -- command args...

--gate-bpf-on-cap-bpf adds the rules containerd 1.7 and Docker 23 added to their default
profiles (containerd#7301, moby#43987): bpf(2) with CAP_BPF, perf_event_open(2) with CAP_PERFMON.
Needs Debian's python3-seccomp (libseccomp's bindings)."""

import argparse
import errno
import json
import os
import platform
import sys

import seccomp

OPS = {
    "SCMP_CMP_NE": seccomp.NE,
    "SCMP_CMP_LT": seccomp.LT,
    "SCMP_CMP_LE": seccomp.LE,
    "SCMP_CMP_EQ": seccomp.EQ,
    "SCMP_CMP_GE": seccomp.GE,
    "SCMP_CMP_GT": seccomp.GT,
    "SCMP_CMP_MASKED_EQ": seccomp.MASKED_EQ,
}
# How profiles name this machine's architecture (Go's GOARCH, or libseccomp's constant).
ARCH_NAMES = {
    "x86_64": {"amd64", "x86_64", "SCMP_ARCH_X86_64"},
    "aarch64": {"arm64", "aarch64", "SCMP_ARCH_AARCH64"},
}[platform.machine()]


def kernel_at_least(version):
    have = tuple(int(p) for p in platform.release().split("-")[0].split(".")[:2])
    want = tuple(int(p) for p in version.split(".")[:2])
    return have >= want


def applies(rule, caps):
    includes, excludes = rule.get("includes") or {}, rule.get("excludes") or {}
    if any(c not in caps for c in includes.get("caps") or []):
        return False
    if includes.get("arches") and not ARCH_NAMES & set(includes["arches"]):
        return False
    if includes.get("minKernel") and not kernel_at_least(includes["minKernel"]):
        return False
    if any(c in caps for c in excludes.get("caps") or []):
        return False
    if ARCH_NAMES & set(excludes.get("arches") or []):
        return False
    return True


def action(name, errno_ret):
    if name == "SCMP_ACT_ALLOW":
        return seccomp.ALLOW
    if name == "SCMP_ACT_ERRNO":
        return seccomp.ERRNO(errno_ret if errno_ret is not None else errno.EPERM)
    if name == "SCMP_ACT_KILL" or name == "SCMP_ACT_KILL_THREAD":
        return seccomp.KILL
    if name == "SCMP_ACT_KILL_PROCESS":
        return seccomp.KILL_PROCESS
    if name == "SCMP_ACT_LOG":
        return seccomp.LOG
    raise SystemExit(f"unsupported seccomp action {name}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", required=True)
    parser.add_argument("--caps", required=True, help="comma-separated, e.g. CAP_BPF,CAP_NET_ADMIN")
    parser.add_argument("--gate-bpf-on-cap-bpf", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise SystemExit("no command to run")
    caps = set(c.strip().upper() for c in args.caps.split(",") if c.strip())
    caps = {c if c.startswith("CAP_") else "CAP_" + c for c in caps}

    with open(args.profile) as f:
        profile = json.load(f)
    rules = list(profile["syscalls"])
    if args.gate_bpf_on_cap_bpf:
        rules.append({"names": ["bpf"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_BPF"]}})
        rules.append({"names": ["perf_event_open"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_PERFMON"]}})
        # The profile's catch-all refusal of both (without CAP_SYS_ADMIN) must not win.
        for rule in rules:
            if rule["action"] != "SCMP_ACT_ALLOW" and {"bpf", "perf_event_open"} & set(rule["names"]):
                rule["names"] = [n for n in rule["names"] if n not in ("bpf", "perf_event_open")]

    default = action(profile["defaultAction"], profile.get("defaultErrnoRet"))
    flt = seccomp.SyscallFilter(defaction=default)
    skipped = []
    for rule in rules:
        if not applies(rule, caps):
            continue
        act = action(rule["action"], rule.get("errnoRet"))
        conditions = [
            seccomp.Arg(a["index"], OPS[a["op"]], a["value"], a.get("valueTwo", 0)) for a in rule.get("args") or []
        ]
        for name in rule["names"]:
            try:
                flt.add_rule(act, name, *conditions)
            except (RuntimeError, ValueError, OSError) as e:
                # Syscalls this libseccomp does not know, or a rule equal to the default.
                skipped.append(f"{name}: {e}")
    if os.environ.get("OCI_SECCOMP_VERBOSE"):
        print(f"oci-seccomp-exec: {len(skipped)} rules skipped: {skipped}", file=sys.stderr)
    flt.load()
    os.execvp(command[0], command)


main()
