"""The network beyond the test node: a network namespace the test bed makes inside its session
(testbed/isolate.py), linked to the node by a veth pair and reached from pods only through the node's routing,
where NetworkPolicy applies (testbed/netpol.py).

Why: kube-network-policies, like most NetworkPolicy implementations, filters what the node forwards; a pod's
connection to an address of the node itself is the node's to allow. On a production node the API server and
the cloud's metadata service are not on the node, so a sandbox's default-deny egress keeps it from them. Here
they are put beyond the node so that the same holds:

- CONTROL_ADDRESS: etcd and kube-apiserver run in this namespace (testbed/controlplane.py); etcd on its
  loopback, out of every pod's and the node's reach;
- OFF_NODE_ADDRESS and METADATA_ADDRESS (169.254.169.254): every TCP connection to them is turned back to the
  node's address (NODE_ADDRESS), same port, so a server of the test bed (the scripted model, a listener a test
  starts) answers there as an off-node host would.

Nothing here routes anywhere else: the namespace knows the link and the pods' subnet behind it, no more.
"""

import subprocess
from pathlib import Path

from testbed.isolate import NODE_ADDRESS, POD_SUBNET

NETNS = "ksq-outside"
LINK = "ksq-out0"  # the node's end of the veth pair; the namespace's end is eth0
NODE_SIDE_ADDRESS = "10.243.0.1"  # the node, as the outside sees it
CONTROL_ADDRESS = "10.243.0.2"  # etcd and kube-apiserver
OFF_NODE_ADDRESS = "10.243.0.3"  # turned back to the node: the test bed's servers as off-node hosts
METADATA_ADDRESS = "169.254.169.254"  # likewise: where clouds serve instance metadata and credentials
PREFIX = 24

# Destination NAT back to the node's address (the port unchanged), and the source rewritten to this namespace's
# address so that the answer comes back the same way.
TURN_BACK = f"""
table ip ksquad-outside {{
  chain prerouting {{
    type nat hook prerouting priority dstnat;
    ip daddr {{ {OFF_NODE_ADDRESS}, {METADATA_ADDRESS} }} meta l4proto tcp dnat to {NODE_ADDRESS}
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat;
    ct status dnat ip daddr {NODE_ADDRESS} masquerade
  }}
}}
"""


def enter(command: list[str]) -> list[str]:
    """`command`, run in the outside namespace."""
    return ["nsenter", f"--net=/run/netns/{NETNS}", "--", *command]


def _run(*command: str, input: str | None = None) -> None:
    done = subprocess.run(command, input=input, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()}")


def create() -> None:
    """Make the namespace and its link (removing a previous session plane's leftovers first)."""
    delete()
    _run("ip", "netns", "add", NETNS)
    _run("ip", "link", "add", LINK, "type", "veth", "peer", "name", "eth0", "netns", NETNS)
    _run("ip", "addr", "add", f"{NODE_SIDE_ADDRESS}/{PREFIX}", "dev", LINK)
    _run("ip", "link", "set", LINK, "up")
    _run("ip", "route", "add", f"{METADATA_ADDRESS}/32", "via", OFF_NODE_ADDRESS)
    inside = ["ip", "-n", NETNS]
    _run(*inside, "link", "set", "lo", "up")
    _run(*inside, "addr", "add", f"{CONTROL_ADDRESS}/{PREFIX}", "dev", "eth0")
    _run(*inside, "addr", "add", f"{OFF_NODE_ADDRESS}/32", "dev", "eth0")
    _run(*inside, "link", "set", "eth0", "up")
    _run(*inside, "route", "add", POD_SUBNET, "via", NODE_SIDE_ADDRESS)
    for key, value in (("net/ipv4/ip_forward", "1"), ("net/ipv4/conf/all/send_redirects", "0")):
        _run(*enter(["sh", "-c", f"echo {value} > /proc/sys/{key}"]))
    _run(*enter(["nft", "-f", "-"]), input=TURN_BACK)


def delete() -> None:
    if Path("/run/netns", NETNS).exists():
        subprocess.run(["ip", "netns", "delete", NETNS], capture_output=True)
    subprocess.run(["ip", "link", "delete", LINK], capture_output=True)
