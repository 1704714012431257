"""P, the first even port from START (default 29600) such that P and P + 1
are both free on 127.0.0.1: a torchrun rendezvous port and the next one,
which a LibTorch 1.13 rank 0 serves its own store on (src/compat/compat.h).
Below Linux's ephemeral range (32768 up), so no client socket takes either
between this pick and the bind.

    python3 two_free_ports.py [START]      prints P
    from two_free_ports import two_free_ports
"""
import socket
import sys


def two_free_ports(start=29600):
    for p in range(start, start + 1000, 2):
        socks = [socket.socket() for _ in range(2)]
        try:
            for s, q in zip(socks, (p, p + 1)):
                s.bind(("127.0.0.1", q))
            return p
        except OSError:
            pass
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no two free ports in a row from {start}")


if __name__ == "__main__":
    print(two_free_ports(int(sys.argv[1]) if len(sys.argv) > 1 else 29600))
