"""A trainer-rank entry point for the rendezvous test: which addresses listen on MASTER_PORT.

It lives in its own module so that the spawned ranks import it without the test module.
"""

from __future__ import annotations

import os


def listening_addresses(port: int) -> list[str]:
    """Local addresses (IPv4 dotted, IPv6 hex) of TCP sockets listening on `port`."""
    found = []
    for table, ipv6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            with open(table, encoding="ascii") as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state = fields[1], fields[3]
            address, port_hex = local.rsplit(":", 1)
            if state != "0A" or int(port_hex, 16) != port:  # 0A = LISTEN
                continue
            if ipv6:
                found.append(address)
            else:
                # /proc shows the IPv4 address as a little-endian hex word.
                found.append(".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


def own_listening_addresses() -> list[str]:
    """Local addresses of the TCP sockets this process listens on (gloo's pairs)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as fh:
            for line in fh.read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    found.append(fields[1].rsplit(":", 1)[0])
    return found


def probe() -> dict[str, object]:
    """This rank's view of the rendezvous (its address, port and who listens on it) and of
    the gloo group it joins."""
    import torch.distributed as dist

    port = int(os.environ["MASTER_PORT"])
    seen: dict[str, object] = {
        "rank": int(os.environ["RANK"]),
        "master_addr": os.environ["MASTER_ADDR"],
        "listening": listening_addresses(port),
        "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
    }
    dist.init_process_group("gloo")
    try:
        seen["gloo_listening"] = own_listening_addresses()
    finally:
        dist.destroy_process_group()
    return seen
