"""
The figure of `scale.py --plot`: S3 requests per operation against its size (log-log), and a worker's RSS against its
tenants. matplotlib is imported here only (``pip install "offload-haystack[bench]"``).
"""

from pathlib import Path

Curve = list[tuple[int, float]]


def plot(requests: dict[str, Curve], memory: dict[str, Curve], path: Path) -> None:
    """
    Draw both panels and save them as a PNG.

    :param requests: Per operation (its label names the size: T, N, A or tenants), (size, requests) points.
    :param memory: Per engine, (tenants, RSS MiB) points; the right panel is left out when empty.
    :param path: Where to write the PNG.
    """
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    panels = 2 if memory else 1
    figure, axes = plt.subplots(1, panels, figsize=(7 * panels, 6.5), squeeze=False)
    left = axes[0][0]
    markers = "osD^v<>ph*"
    for index, (label, points) in enumerate(requests.items()):
        sizes, counts = zip(*points, strict=True)
        left.plot(sizes, counts, marker=markers[index % len(markers)], label=label)
    left.set(xscale="log", yscale="log", xlabel="size (T turns, N results, A approvals, tenants)")
    left.set(ylabel="S3 requests per operation (moto)", title="Requests against size")
    left.grid(True, which="major", alpha=0.3)
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    if memory:
        right = axes[0][1]
        for engine, points in memory.items():
            tenants, rss = zip(*points, strict=True)
            right.plot(tenants, rss, marker="o", label=engine)
        right.set(xscale="log", xlabel="tenants served (credentials and keys per tenant)", ylabel="RSS MiB")
        right.set(title="A worker's memory against its tenants", ylim=(0, None))
        right.grid(True, which="major", alpha=0.3)
        right.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
