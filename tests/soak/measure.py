"""What both soak scripts measure: percentiles (nearest rank) and a process's resident memory."""


def percentile(values, q):
    """The q-th percentile (0..100) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def rss_mib(pid):
    """VmRSS of `pid` in MiB (one decimal), None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None
