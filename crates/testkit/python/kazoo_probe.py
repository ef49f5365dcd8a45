"""Drives kazoo's (2.8) lock, election and semaphore recipes from line
commands on stdin, so dlock's tests can hold a kazoo lock while dlock
contends, and the other way round. One answer line per command (elect's
leadership and buy's result come later, as their own lines):

  lock PATH MS [PATTERN...]   Lock(PATH, extra_lock_patterns=PATTERNs).acquire
                              (MS < 0: no timeout)     -> "acquired NODE" | "timeout"
  read PATH MS                ReadLock(PATH).acquire  -> "acquired NODE" | "timeout"
  semaphore PATH MAX MS       Semaphore(PATH, max_leases=MAX).acquire
                                                       -> "acquired NODE" | "timeout"
  release PATH                release what this probe holds at PATH -> "released"
  elect PATH ID               Election(PATH, ID).run in a thread     -> "candidate"
                              then, once leading:                       "leader ID"
  resign PATH                 end the leadership function (or cancel a
                              waiting candidacy) and wait for run() -> "resigned"
  contenders PATH             Election(PATH).contenders()   -> "contenders ID,ID,..."
  buy LOCK STOCK CLIENTS [PATTERN...]
                              a flash sale: CLIENTS threads, each with its own
                              client and Lock(LOCK, extra_lock_patterns=
                              PATTERNs), decrement the number stored at STOCK
                              (read, then write) until it is 0 -> "sold N"
  quit

Usage: python3 kazoo_probe.py HOST:PORT
"""
import sys
import threading
import time

from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout


def connect(hosts):
    client = KazooClient(hosts=hosts, timeout=10.0)
    client.start(timeout=30)
    return client


class Probe(object):
    def __init__(self, hosts):
        self.hosts = hosts
        self.client = connect(hosts)
        self.held = {}
        self.elections = {}
        self.out = threading.Lock()

    def say(self, line):
        with self.out:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def hold(self, path, recipe, ms):
        """Acquires `recipe` (a kazoo Lock or Semaphore) within `ms` (forever
        if negative) and keeps it, to be released by `path`. Whether it got
        it."""
        timeout = None if ms < 0 else ms / 1000.0
        try:
            got = recipe.acquire(timeout=timeout)
        except LockTimeout:
            got = False
        if got:
            self.held[path] = recipe
        return got

    def lock(self, path, ms, patterns, kind="Lock"):
        make = getattr(self.client, kind)
        lock = make(path, "kazoo-probe", extra_lock_patterns=patterns)
        if not self.hold(path, lock, ms):
            return "timeout"
        return "acquired %s/%s" % (path, lock.node)

    def semaphore(self, path, max_leases, ms):
        sem = self.client.Semaphore(path, "kazoo-probe", max_leases=max_leases)
        if not self.hold(path, sem, ms):
            return "timeout"
        return "acquired %s" % sem.create_path

    def release(self, path):
        self.held.pop(path).release()
        return "released"

    def elect(self, path, ident):
        election = self.client.Election(path, ident)
        resign = threading.Event()

        def lead():
            self.say("leader %s" % ident)
            resign.wait()

        thread = threading.Thread(target=election.run, args=(lead,))
        thread.daemon = True
        self.elections[path] = (election, resign, thread)
        thread.start()
        return "candidate"

    def resign(self, path):
        election, resign, thread = self.elections.pop(path)
        resign.set()
        election.cancel()
        thread.join()
        return "resigned"

    def contenders(self, path):
        return "contenders " + ",".join(self.client.Election(path).contenders())

    def buy(self, lock_path, stock_path, clients, patterns):
        sold = [0] * clients
        failed = []

        def buyer(i):
            client = connect(self.hosts)
            try:
                lock = client.Lock(lock_path, "buyer-%d" % i, extra_lock_patterns=patterns)
                while True:
                    with lock:
                        data, _ = client.get(stock_path)
                        stock = int(data.decode().strip())
                        if stock <= 0:
                            return
                        time.sleep(0.001)
                        client.set(stock_path, str(stock - 1).encode())
                        sold[i] += 1
            except Exception as e:  # reported, not swallowed
                failed.append(repr(e))
            finally:
                client.stop()
                client.close()

        def run():
            threads = [threading.Thread(target=buyer, args=(i,)) for i in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if failed:
                self.say("error buy " + "; ".join(failed))
            else:
                self.say("sold %d" % sum(sold))

        threading.Thread(target=run).start()
        return "buying"

    def handle(self, words):
        cmd, args = words[0], words[1:]
        if cmd == "lock":
            return self.lock(args[0], int(args[1]), args[2:])
        if cmd == "read":
            return self.lock(args[0], int(args[1]), [], "ReadLock")
        if cmd == "semaphore":
            return self.semaphore(args[0], int(args[1]), int(args[2]))
        if cmd == "release":
            return self.release(args[0])
        if cmd == "elect":
            return self.elect(args[0], args[1])
        if cmd == "resign":
            return self.resign(args[0])
        if cmd == "contenders":
            return self.contenders(args[0])
        if cmd == "buy":
            return self.buy(args[0], args[1], int(args[2]), args[3:])
        return "error unknown command %s" % cmd


def main():
    probe = Probe(sys.argv[1])
    probe.say("ready")
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        try:
            probe.say(probe.handle(words))
        except Exception as e:
            probe.say("error %s %r" % (words[0], e))
    for election, resign, _ in probe.elections.values():
        resign.set()
        election.cancel()
    probe.client.stop()
    probe.client.close()


if __name__ == "__main__":
    main()
