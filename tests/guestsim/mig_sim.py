#!/usr/bin/env python3
# GUEST SIMULATOR: NVIDIA Multi-Instance GPU behind the nvidia-smi stand-in
# (opt/nvidia-smi runs this for every MIG command; never run directly).
#
# What it models, for the profile's one GPU (index 0):
#   nvidia-smi -i 0 -mig 1|0     MIG mode. Applied at once ("Enabled MIG Mode for
#                                GPU ...", "All done."), or, with the knob
#                                mig_mode_pending, left pending until the next
#                                reboot with NVIDIA's warning ("In use by
#                                another client"). A card without MIG
#                                (MIG_PROFILES empty: the L4) answers "Not
#                                Supported" and exits 3.
#   nvidia-smi mig -lgip         the real H200's -lgip capture
#                                (h200-passthrough-vm/2026-12-01/), its Free
#                                column recomputed from what is created
#   nvidia-smi mig -lgi / -lci   NVIDIA's documented tables (MIG user guide)
#   nvidia-smi mig -cgi IDS [-C] GPU instances placed as the card's -lgipp
#                                capture says (MIG_PLACEMENTS): multi-slice
#                                ones at the highest free start, 1-slice ones at
#                                the lowest; -C adds each one's compute instance
#   nvidia-smi mig -dci / -dgi   destroys them (compute instances first: -dgi
#                                refuses a GPU instance that still has one)
#   nvidia-smi -L                the GPU line, and its MIG devices with UUIDs
#   mig.mode.current/pending     for the --query-gpu stand-in
#   reboot (mig_sim.py boot)     a pending mode becomes current (not with the
#                                knob mig_mode_stuck); GPU instances do not
#                                survive a reset or reboot (as on a real card)
# State: <root>/.guestsim/state/mig/state.json.
# What it does not model: more than one GPU, compute instance profiles other
# than the full one (-cci), processes holding the GPU, the memory each
# instance uses.
import json
import os
import sys
import uuid

ROOT = os.environ["FACTORY_GUESTSIM_ROOT"]
GS = os.path.join(ROOT, ".guestsim")
STATE = os.path.join(GS, "state", "mig", "state.json")


def profile_env():
    env = {}
    with open(os.path.join(GS, "profile.env")) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            k, v = line.split("=", 1)
            env[k] = v.strip('"')
    return env


ENV = profile_env()
BUS_ID = ENV.get("PCI_BUS_ID", "00000000:00:00.0")


def knob(name):
    return os.path.exists(os.path.join(GS, "knobs", name))


def load():
    try:
        with open(STATE) as f:
            return json.load(f)
    except FileNotFoundError:
        mode = ENV.get("MIG_MODE", "Disabled")
        return {"current": mode, "pending": mode, "gpu_instances": []}


def save(s):
    os.makedirs(os.path.dirname(STATE), exist_ok=True)
    tmp = STATE + ".tmp"
    with open(tmp, "w") as f:
        json.dump(s, f)
    os.replace(tmp, STATE)


def capable():
    return bool(ENV.get("MIG_PROFILES"))


def profiles():
    """The -lgip capture's rows: (line pair, name, id, total) in order."""
    path = os.path.join(GS, "data", ENV["MIG_PROFILES"])
    with open(path) as f:
        lines = f.read().splitlines()
    # The capture holds -lgip's table, then -lgi's one line.
    end = max(i for i, l in enumerate(lines) if l.startswith("+---"))
    table = lines[: end + 1]
    rows = []
    for i, l in enumerate(table):
        parts = l.strip("|").split()
        if len(parts) >= 5 and parts[1] == "MIG":
            rows.append({"line": i, "name": parts[2], "id": int(parts[3]),
                         "total": int(parts[4].split("/")[1])})
    return table, rows


def placements():
    """MIG_PLACEMENTS: "ID:start,start,...:size ..." from the -lgipp capture."""
    out = {}
    for spec in ENV.get("MIG_PLACEMENTS", "").split():
        pid, starts, size = spec.split(":")
        out[int(pid)] = ([int(x) for x in starts.split(",")], int(size))
    return out


def used(s):
    occ = set()
    for g in s["gpu_instances"]:
        occ.update(range(g["start"], g["start"] + g["size"]))
    return occ


def free_start(s, pid):
    starts, size = placements()[pid]
    occ = used(s)
    # NVIDIA does not document which free placement the driver picks; here a
    # multi-slice instance takes the highest and a 1-slice one the lowest, so
    # the documented "-cgi 9,19,19,19,19" (a 3g beside four 1g) fits.
    for st in (reversed(starts) if size > 1 else starts):
        if not occ.intersection(range(st, st + size)):
            return st, size
    return None


def free_count(s, pid, total):
    trial = {"gpu_instances": list(s["gpu_instances"])}
    n = 0
    while n < total:
        p = free_start(trial, pid)
        if p is None:
            break
        trial["gpu_instances"].append({"start": p[0], "size": p[1]})
        n += 1
    return n


def name_of(pid):
    for r in profiles()[1]:
        if r["id"] == pid:
            return r["name"]
    return None


def mig_uuid(gi):
    base = ENV.get("GPU_UUID", "GPU-0")
    return "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_URL, "guestsim/%s/gi/%d" % (base, gi)))


def not_enabled():
    print("No MIG-enabled devices found.")
    return 0


def cmd_lgip(s):
    if not capable():
        print("No MIG-supported devices found.")
        return 0
    table, rows = profiles()
    for r in rows:
        line = table[r["line"]]
        free = free_count(s, r["id"], r["total"]) if s["current"] == "Enabled" else r["total"]
        old = "%d/%d" % (r["total"], r["total"])
        new = "%d/%d" % (free, r["total"])
        table[r["line"]] = line.replace(" " + old + " ", " " + new.rjust(len(old)) + " ", 1)
    print("\n".join(table))
    return 0


def cmd_lgi(s):
    if s["current"] != "Enabled":
        return not_enabled()
    if not s["gpu_instances"]:
        print("No GPU instances found.")
        return 6
    bar = "+" + "-" * 55 + "+"
    print(bar)
    print("| GPU instances:".ljust(56) + "|")
    print("| GPU   Name             Profile  Instance   Placement  |")
    print("|                          ID       ID       Start:Size |")
    print("|" + "=" * 55 + "|")
    for g in sorted(s["gpu_instances"], key=lambda g: g["id"]):
        cells = "|   0  MIG %-13s %3d %8d %10s" % (
            g["profile"], g["profile_id"], g["id"], "%d:%d" % (g["start"], g["size"]))
        print(cells.ljust(56) + "|")
        print(bar)
    return 0


def cmd_lci(s):
    if s["current"] != "Enabled":
        return not_enabled()
    cis = [g for g in s["gpu_instances"] if g.get("ci")]
    if not cis:
        print("No compute instances found.")
        return 6
    bar = "+" + "-" * 68 + "+"
    print(bar)
    print("| Compute instances:".ljust(69) + "|")
    print("| GPU     GPU       Name             Profile   Instance   Placement  |")
    print("|       Instance                       ID        ID       Start:Size |")
    print("|         ID                                                         |")
    print("|" + "=" * 68 + "|")
    for g in sorted(cis, key=lambda g: g["id"]):
        slices = int(g["profile"].split("g.")[0])
        cells = "|   0 %6d       MIG %-13s %4d %9d %11s" % (
            g["id"], g["profile"], slices - 1 if slices < 7 else 4, 0, "0:%d" % slices)
        print(cells.ljust(69) + "|")
        print(bar)
    return 0


def cmd_cgi(s, ids, with_ci):
    if s["current"] != "Enabled":
        print("No MIG-enabled devices found.")
        return 6
    rc = 0
    for raw in ids.split(","):
        raw = raw.strip()
        pid = int(raw) if raw.isdigit() else next(
            (r["id"] for r in profiles()[1] if r["name"] == raw), -1)
        name = name_of(pid)
        place = free_start(s, pid) if name else None
        if place is None:
            print("Unable to create a GPU instance on GPU  0 using profile %s: %s" % (
                raw, "Insufficient Resources" if name else "Invalid Argument"))
            rc = 2
            break
        taken = {g["id"] for g in s["gpu_instances"]}
        gi = next(i for i in range(1, 64) if i not in taken)
        s["gpu_instances"].append({"id": gi, "profile": name, "profile_id": pid,
                                   "start": place[0], "size": place[1], "ci": with_ci})
        print("Successfully created GPU instance ID %2d on GPU  0 using profile MIG %s (ID %2d)"
              % (gi, name, pid))
        if with_ci:
            print("Successfully created compute instance ID  0 on GPU  0 GPU instance ID %2d "
                  "using profile MIG %s (ID %2d)" % (gi, name, 0))
    save(s)
    if rc:
        print("Failed to create GPU instances: Insufficient Resources")
    return rc


def cmd_dci(s):
    if s["current"] != "Enabled":
        return not_enabled()
    cis = [g for g in s["gpu_instances"] if g.get("ci")]
    if not cis:
        print("No compute instances found.")
        return 6
    for g in cis:
        g["ci"] = False
        print("Successfully destroyed compute instance ID  0 from GPU  0 GPU instance ID %2d"
              % g["id"])
    save(s)
    return 0


def cmd_dgi(s):
    if s["current"] != "Enabled":
        return not_enabled()
    if not s["gpu_instances"]:
        print("No GPU instances found.")
        return 6
    rc = 0
    keep = []
    for g in s["gpu_instances"]:
        if g.get("ci"):
            print("Unable to destroy GPU instance ID %2d from GPU  0: In use by another client"
                  % g["id"])
            keep.append(g)
            rc = 19
        else:
            print("Successfully destroyed GPU instance ID %2d from GPU  0" % g["id"])
    s["gpu_instances"] = keep
    save(s)
    return rc


def cmd_mode(s, on):
    if not capable():
        print("Unable to %s MIG Mode for GPU %s: Not Supported" % (
            "enable" if on else "disable", BUS_ID))
        print("Terminating early due to previous errors.")
        return 3
    want = "Enabled" if on else "Disabled"
    if not on and s["gpu_instances"]:
        print("Unable to disable MIG Mode for GPU %s: In use by another client" % BUS_ID)
        return 19
    s["pending"] = want
    if knob("mig_mode_pending") and s["current"] != want:
        save(s)
        print("Warning: MIG mode is in pending %s state for GPU %s:In use by another client"
              % ("enable" if on else "disable", BUS_ID))
        print("%s is currently being used by one or more other processes (e.g. CUDA application "
              "or a monitoring application such as another instance of nvidia-smi). Please first "
              "kill all processes using the device and retry the command or reboot the system to "
              "make MIG mode effective." % BUS_ID)
        print("All done.")
        return 0
    s["current"] = want
    if not on:
        s["gpu_instances"] = []
    save(s)
    print("%s MIG Mode for GPU %s" % (want, BUS_ID))
    print("All done.")
    return 0


def cmd_list(s):
    print(ENV.get("LIST_LINE", ""))
    if s["current"] == "Enabled":
        for n, g in enumerate(sorted(s["gpu_instances"], key=lambda g: g["id"])):
            if g.get("ci"):
                print("  MIG %-12s Device %2d: (UUID: %s)" % (g["profile"], n, mig_uuid(g["id"])))
    return 0


def cmd_query(s, field):
    if not capable():
        return "[N/A]"
    return s["current"] if field == "mig.mode.current" else s["pending"]


def cmd_boot(s):
    # Knob mig_mode_stuck: something outside the guest keeps the mode pending.
    if not knob("mig_mode_stuck"):
        s["current"] = s["pending"]
    s["gpu_instances"] = []
    save(s)
    return 0


def main(argv):
    s = load()
    if argv[0] == "boot":
        return cmd_boot(s)
    if argv[0] == "query":
        print(cmd_query(s, argv[1]))
        return 0
    if argv[0] == "list":
        return cmd_list(s)
    if argv[0] == "mode":
        return cmd_mode(s, argv[1] in ("1", "ENABLED", "Enabled"))
    if argv[0] == "mig":
        args = [a for a in argv[1:]]
        if "-i" in args:
            k = args.index("-i")
            if args[k + 1] != "0":
                print("No devices were found")
                return 6
            del args[k:k + 2]
        if not args:
            print("guestsim nvidia-smi mig: no command", file=sys.stderr)
            return 2
        op = args[0]
        if op in ("-lgip", "--list-gpu-instance-profiles"):
            return cmd_lgip(s)
        if op in ("-lgi", "--list-gpu-instances"):
            return cmd_lgi(s)
        if op in ("-lci", "--list-compute-instances"):
            return cmd_lci(s)
        if op in ("-cgi", "--create-gpu-instance") and len(args) >= 2:
            return cmd_cgi(s, args[1], "-C" in args[2:] or "--default-compute-instance" in args[2:])
        if op in ("-dci", "--destroy-compute-instance"):
            return cmd_dci(s)
        if op in ("-dgi", "--destroy-gpu-instance"):
            return cmd_dgi(s)
        print("guestsim nvidia-smi mig: unsupported arguments '%s'" % " ".join(args),
              file=sys.stderr)
        return 2
    print("guestsim mig_sim: unknown call %r" % argv, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
