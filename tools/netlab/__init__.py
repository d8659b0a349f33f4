"""The network lab (docs/ARCHITECTURE.md "Network lab"): pages in network namespaces behind
emulated links (rate, delay, jitter, loss) for the bench and the tests."""
from tools.netlab.netns import Netlab, NetlabUnavailable, preflight
from tools.netlab.profiles import PROFILES, Direction, Link, profile

__all__ = ["Netlab", "NetlabUnavailable", "preflight", "PROFILES", "Direction", "Link", "profile"]
