"""What the exchange and allreduce benchmark sites share: one clock for the
whole machine (CLOCK_MONOTONIC, whatever the network namespace), starting a
round at an agreed instant, and the CPU time of a site's processes."""

import os
import resource
import time


def now():
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def sleep_until(t):
    while True:
        left = t - now()
        if left <= 0:
            return
        # Sleep most of the way, spin the last stretch: the sites must start
        # within a fraction of a millisecond of each other.
        time.sleep(left - 0.002 if left > 0.003 else 0)


def daemon_cpu(pid):
    """CPU seconds (user + system) of process `pid` so far; 0 if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def own_cpu():
    """CPU seconds (user + system) of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
