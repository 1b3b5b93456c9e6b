#!/usr/bin/env python3
"""Generate the monitor's recorded procfs traces (tests/data/monitor/*.trace).

Each trace is a sequence of one-second ticks of a simulated 2-core box
running edgelmd with two engine workers (threads "edgelmd:w0", "edgelmd:w1").
Per tick it writes the procfs/sysfs files whose content changed, in the
formats of proc(5), Documentation/accounting/psi.rst and cgroup-v2.rst, plus
`set` lines for the daemon's inference figures and `expect` lines with the
flag states the classifier must report after that tick's sample (written by
hand from the rules in docs/monitor.md with the default thresholds: a flag
turns on after 2 samples that satisfy its on rule and off after 3 that
satisfy its off rule).

    python3 tests/data/monitor/mktraces.py     # rewrites the *.trace files

Trace syntax (read by tests/unit/test_monitor_traces.c):
    # comment
    tick                      start the next tick (1 s after the previous)
    file <path>               the lines up to "end" become <root>/<path>
    end
    set <metric> <value>      set a label-less inference gauge or counter
    expect <flag> <0|1>       the flag's state after this tick
    reason <flag> <text>      the flag's reason contains <text>
"""
import os

HZ = 100  # USER_HZ ticks per second in /proc/stat and <pid>/stat
FLAGS = ["compute_bound", "bandwidth_bound", "cpu_contention",
         "memory_pressure", "swapping", "io_bound"]
MEM_TOTAL_KB = 24 * 1024 * 1024


class Box:
    """Cumulative counters of the simulated box."""

    def __init__(self):
        self.cpu = [[0] * 8 for _ in range(2)]  # user nice system idle iowait irq softirq steal
        self.psi = {r: [0, 0] for r in ("cpu", "memory", "io")}  # some, full totals (us)
        self.pswpin = self.pswpout = self.pgmajfault = 0
        self.proc_majflt = self.proc_utime = self.proc_stime = 0
        self.th = {101: dict(name="edgelmd:w0", utime=0, run=0, delay=0, nv=0, niv=0),
                   102: dict(name="edgelmd:w1", utime=0, run=0, delay=0, nv=0, niv=0)}
        self.cg_events = dict(low=0, high=0, max=0, oom=0, oom_kill=0)
        self.last = {}
        self.lines = []
        self.gen_tokens = self.decode_s = self.weight_bytes = 0.0

    def file(self, path, text):
        if self.last.get(path) == text:
            return
        self.last[path] = text
        self.lines.append("file " + path)
        self.lines.extend(text.rstrip("\n").split("\n"))
        self.lines.append("end")

    def tick(self, busy=0.01, wait=0.0, nivcsw=1, steal=0.0, iowait=0.0,
             psi_cpu=0.0, psi_mem=0.0, psi_io=0.0, avail=0.8, swapin=0,
             majflt=0, cg=None, cg_high=0, running=0, loading=0, bw=None,
             expect=None, reason=None, note=None):
        """Advance one second. busy/wait: share of the second each worker ran /
        waited; steal/iowait: share of each core; psi_*: stalled share of the
        second ("some"; memory/io "full" gets half); avail: MemAvailable share;
        swapin: pages/s; majflt: the daemon's major faults/s; cg: cgroup
        memory.current/memory.max (None: not in a cgroup); bw: weight bandwidth
        as a share of the peak while generating."""
        self.lines.append("tick" + ("  # " + note if note else ""))
        for c in self.cpu:
            st = round(steal * HZ)
            io = round(iowait * HZ)
            used = min(HZ - st - io, round(max(busy, 0.02) * HZ))
            c[0] += used - used // 10
            c[2] += used // 10
            c[7] += st
            c[4] += io
            c[3] += HZ - st - io - used
        stat = ""
        for i, c in enumerate(self.cpu):
            stat += "cpu%d " % i + " ".join(str(v) for v in c) + " 0 0\n"
        stat += "procs_running %d\nprocs_blocked %d\n" % (
            1 + round(2 * busy) + (2 if steal or psi_cpu else 0), 1 if iowait or psi_io else 0)
        self.file("proc/stat", stat)
        self.file("proc/loadavg", "%.2f %.2f %.2f 3/210 4242\n" % (2 * busy, 1.5 * busy, busy))
        self.file("proc/meminfo",
                  "MemTotal:       %d kB\nMemFree:        %d kB\nMemAvailable:   %d kB\n"
                  "SwapTotal:      %d kB\nSwapFree:       %d kB\n" % (
                      MEM_TOTAL_KB, int(MEM_TOTAL_KB * avail * 0.5), int(MEM_TOTAL_KB * avail),
                      8 * 1024 * 1024, 8 * 1024 * 1024 - self.pswpout * 4))
        self.pswpin += swapin
        self.pswpout += swapin // 2
        self.pgmajfault += majflt + swapin
        self.file("proc/vmstat", "pswpin %d\npswpout %d\npgmajfault %d\noom_kill 0\n" % (self.pswpin, self.pswpout, self.pgmajfault))
        for res, ratio in (("cpu", psi_cpu), ("memory", psi_mem), ("io", psi_io)):
            self.psi[res][0] += round(ratio * 1e6)
            self.psi[res][1] += round(ratio * 0.5e6) if res != "cpu" else 0
            self.file("proc/pressure/" + res,
                      "some avg10=%.2f avg60=0.00 avg300=0.00 total=%d\n"
                      "full avg10=%.2f avg60=0.00 avg300=0.00 total=%d\n" % (
                          ratio * 100, self.psi[res][0],
                          ratio * 50 if res != "cpu" else 0, self.psi[res][1]))
        self.proc_majflt += majflt
        for tid, t in self.th.items():
            t["utime"] += round(busy * HZ)
            t["run"] += round(busy * 1e9)
            t["delay"] += round(wait * 1e9)
            t["niv"] += nivcsw
            t["nv"] += 5
            self.file("proc/self/task/%d/stat" % tid,
                      "%d (%s) R 100 100 100 0 -1 0 0 0 0 0 %d 0 0 0 20 0 3\n" % (
                          tid, t["name"], t["utime"]))
            self.file("proc/self/task/%d/schedstat" % tid, "%d %d %d\n" % (
                t["run"], t["delay"], t["nv"] + t["niv"]))
            self.file("proc/self/task/%d/status" % tid,
                      "voluntary_ctxt_switches:\t%d\nnonvoluntary_ctxt_switches:\t%d\n"
                      % (t["nv"], t["niv"]))
        self.proc_utime += 2 * round(busy * HZ)
        self.file("proc/self/stat",
                  "100 (edgelmd) S 1 100 100 0 -1 0 0 0 %d 0 %d %d 0 0 20 0 3\n" % (
                      self.proc_majflt, self.proc_utime, self.proc_stime))
        self.file("proc/self/status",
                  "VmLck:\t 1048576 kB\nVmRSS:\t 1300000 kB\nVmSwap:\t 0 kB\n")
        if cg is not None:
            self.file("proc/self/cgroup", "0::/system.slice/edgelmd.service\n")
            self.file("sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids\n")
            d = "sys/fs/cgroup/system.slice/edgelmd.service/"
            limit = 2 * 1024 ** 3
            self.cg_events["high"] += cg_high
            self.cg_events["max"] += cg_high // 2
            self.file(d + "memory.max", "%d\n" % limit)
            self.file(d + "memory.current", "%d\n" % int(limit * cg))
            self.file(d + "memory.events", "".join(
                "%s %d\n" % kv for kv in self.cg_events.items()))
            self.file(d + "cpu.stat", "usage_usec 1000\nuser_usec 900\nsystem_usec 100\n"
                      "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\n")
        else:
            self.file("proc/self/cgroup", "0::/\n")
        self.lines.append("set edgelm_sequences_running %d" % running)
        self.lines.append("set edgelm_model_loading %d" % loading)
        if running:
            self.gen_tokens += 20
            self.decode_s += 0.9
            self.weight_bytes += (bw if bw is not None else 0.5) * 10e9 * 0.9
            self.lines.append("set edgelm_generation_tokens_total %g" % self.gen_tokens)
            self.lines.append("set edgelm_decode_seconds_total %g" % self.decode_s)
            self.lines.append("set edgelm_weight_read_bytes_total %g" % self.weight_bytes)
        for f, v in (expect or {}).items():
            assert f in FLAGS, f
            self.lines.append("expect %s %d" % (f, v))
        for f, text in (reason or {}).items():
            self.lines.append("reason %s %s" % (f, text))

    def write(self, path, title):
        with open(path, "w") as fp:
            fp.write("# %s\n# generated by mktraces.py; do not edit by hand\n" % title)
            fp.write("set edgelm_memory_peak_bandwidth_bytes_per_second 1e10\n")
            fp.write("\n".join(self.lines) + "\n")


def all_off(**on):
    e = {f: 0 for f in FLAGS}
    e.update(on)
    return e


def saturated():
    b = Box()
    for _ in range(3):
        b.tick(expect=all_off(), note="idle")
    b.tick(busy=0.99, running=1, expect=all_off(), note="saturated: 1st sample")
    for _ in range(5):
        b.tick(busy=0.99, running=1, expect=all_off(compute_bound=1),
               reason={"compute_bound": "workers 99% busy"})
    b.tick(busy=0.80, running=1, expect=all_off(compute_bound=1), note="in the band: holds")
    b.tick(busy=0.70, running=1, expect=all_off(compute_bound=1), note="below off: 1 of 3")
    b.tick(busy=0.99, running=1, expect=all_off(compute_bound=1), note="back: count resets")
    b.tick(expect=all_off(compute_bound=1), note="idle 1 of 3")
    b.tick(expect=all_off(compute_bound=1), note="idle 2 of 3")
    b.tick(expect=all_off(), note="idle 3 of 3: off")
    # Busy and streaming the weights near the peak: bandwidth_bound, and
    # compute_bound stays off while it is on.
    b.tick(busy=0.99, running=1, bw=0.85, expect=all_off(), note="bandwidth 85%: 1st")
    for _ in range(5):
        b.tick(busy=0.99, running=1, bw=0.85, expect=all_off(bandwidth_bound=1),
               reason={"bandwidth_bound": "weight bandwidth 85% of measured peak"})
    b.tick(busy=0.99, running=1, bw=0.5, expect=all_off(bandwidth_bound=1), note="bw 50%: 1/3")
    b.tick(busy=0.99, running=1, bw=0.5, expect=all_off(bandwidth_bound=1), note="2/3")
    b.tick(busy=0.99, running=1, bw=0.5, expect=all_off(), note="3/3: off; compute 1st")
    b.tick(busy=0.99, running=1, bw=0.5, expect=all_off(compute_bound=1))
    return b


def contended():
    b = Box()
    for _ in range(3):
        b.tick(busy=0.5, running=1, expect=all_off(), note="generating alone")
    # A noisy neighbour: the hypervisor steals 15% and runnable tasks stall
    # 35% of the time; workers get 60% of their cores. Run-queue wait and
    # involuntary switches stay inside their bands, so steal and PSI decide.
    b.tick(busy=0.60, wait=0.10, nivcsw=30, steal=0.15, psi_cpu=0.35, running=1,
           expect=all_off(), note="contended: 1st")
    for _ in range(5):
        b.tick(busy=0.60, wait=0.10, nivcsw=30, steal=0.15, psi_cpu=0.35, running=1,
               expect=all_off(cpu_contention=1),
               reason={"cpu_contention": "steal 15% >= 5%; psi cpu some 35% >= 25%"})
    b.tick(busy=0.80, wait=0.10, nivcsw=30, steal=0.03, psi_cpu=0.15, running=1,
           expect=all_off(cpu_contention=1), note="in the bands: holds")
    b.tick(busy=0.99, wait=0.01, nivcsw=2, running=1, expect=all_off(cpu_contention=1))
    b.tick(busy=0.99, wait=0.01, nivcsw=2, running=1, expect=all_off(cpu_contention=1))
    b.tick(busy=0.99, wait=0.01, nivcsw=2, running=1, expect=all_off(), note="off; compute 1st")
    b.tick(busy=0.99, wait=0.01, nivcsw=2, running=1, expect=all_off(compute_bound=1))
    # Our own workers starved by a local hog: run-queue wait and switches.
    b.tick(busy=0.50, wait=0.50, nivcsw=200, psi_cpu=0.5, running=1,
           expect=all_off(compute_bound=1), note="local hog: 1st")
    b.tick(busy=0.50, wait=0.50, nivcsw=200, psi_cpu=0.5, running=1,
           expect=all_off(cpu_contention=1, compute_bound=1),
           reason={"cpu_contention": "workers wait for a cpu 50% of the time"})
    b.tick(busy=0.50, wait=0.50, nivcsw=200, psi_cpu=0.5, running=1,
           expect=all_off(cpu_contention=1), note="compute_bound off after 3")
    return b


def mempressure():
    b = Box()
    for _ in range(3):
        b.tick(expect=all_off(), note="plenty of memory")
    b.tick(avail=0.06, psi_mem=0.20, expect=all_off(), note="low memory: 1st")
    for _ in range(3):
        b.tick(avail=0.06, psi_mem=0.20, expect=all_off(memory_pressure=1),
               reason={"memory_pressure": "MemAvailable 6.0% of RAM <= 10%"})
    b.tick(avail=0.12, psi_mem=0.05, expect=all_off(memory_pressure=1), note="in the bands")
    b.tick(avail=0.40, expect=all_off(memory_pressure=1))
    b.tick(avail=0.40, expect=all_off(memory_pressure=1))
    b.tick(avail=0.40, expect=all_off(), note="off")
    # The daemon's cgroup nears memory.max and hits memory.high.
    b.tick(cg=0.50, expect=all_off(), note="in a cgroup, 50% of memory.max")
    b.tick(cg=0.95, cg_high=5, expect=all_off(), note="95%: 1st")
    for _ in range(3):
        b.tick(cg=0.95, cg_high=5, expect=all_off(memory_pressure=1),
               reason={"memory_pressure": "cgroup memory 95% of memory.max >= 90%"})
    b.tick(cg=0.50, expect=all_off(memory_pressure=1))
    b.tick(cg=0.50, expect=all_off(memory_pressure=1))
    b.tick(cg=0.50, expect=all_off(), note="off")
    return b


def swapping():
    b = Box()
    for _ in range(3):
        b.tick(busy=0.6, running=1, expect=all_off(), note="generating")
    b.tick(busy=0.6, running=1, swapin=1000, majflt=200, psi_mem=0.05, expect=all_off(),
           note="swap-in 4 MB/s and 200 major faults/s: 1st")
    for _ in range(3):
        b.tick(busy=0.6, running=1, swapin=1000, majflt=200, psi_mem=0.05,
               expect=all_off(swapping=1),
               reason={"swapping": "200 major faults/s in the daemon during inference"})
    b.tick(busy=0.6, running=1, expect=all_off(swapping=1))
    b.tick(busy=0.6, running=1, expect=all_off(swapping=1))
    b.tick(busy=0.6, running=1, expect=all_off(), note="off")
    for _ in range(3):
        b.tick(swapin=1000, expect=all_off(), note="swap-in while idle: no flag")
    return b


def ioload():
    b = Box()
    b.tick(loading=1, expect=all_off(), note="loading the model")
    b.tick(loading=1, psi_io=0.5, iowait=0.3, expect=all_off(), note="io stalls: 1st")
    for _ in range(3):
        b.tick(loading=1, psi_io=0.5, iowait=0.3, expect=all_off(io_bound=1),
               reason={"io_bound": "psi io some 50% >= 20% while loading"})
    b.tick(psi_io=0.5, expect=all_off(io_bound=1), note="loaded: 1 of 3")
    b.tick(psi_io=0.5, expect=all_off(io_bound=1))
    b.tick(psi_io=0.5, expect=all_off(), note="off")
    for _ in range(3):
        b.tick(psi_io=0.5, expect=all_off(), note="io stalls, not loading: no flag")
    return b


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    for name, fn, title in (
            ("saturated", saturated, "saturated box: compute_bound, then bandwidth_bound"),
            ("contended", contended, "contended box: steal + PSI cpu, then a local hog"),
            ("mempressure", mempressure, "memory pressure: MemAvailable + PSI, then cgroup"),
            ("swapping", swapping, "active swapping during inference"),
            ("ioload", ioload, "io stalls while loading the model")):
        fn().write(os.path.join(here, name + ".trace"), title)


if __name__ == "__main__":
    main()
