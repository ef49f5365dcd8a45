// Drives Apache Curator 5.4 recipes from line commands on stdin, so dlock's
// tests can hold a Curator lock while dlock contends, and the other way
// round. One command per line; one answer line per command:
//   mutex PATH MS        acquire an InterProcessMutex (MS < 0: no timeout)  -> "acquired NODE" | "timeout"
//   write PATH MS        acquire the write half of an InterProcessReadWriteLock
//   read PATH MS         acquire the read half
//   semmutex PATH MS     acquire an InterProcessSemaphoreMutex
//   revocable PATH MS    acquire an InterProcessMutex made revocable; a later
//                        revocation request prints "revoked NODE" (asynchronously)
//   release PATH         release what this probe holds at PATH           -> "released"
//   revoke NODE          Revoker.attemptRevoke                           -> "revoke-sent"
//   participants PATH    LeaderLatch-style participant ids at PATH       -> "participants ID|LEADER,..."
//   count PATH           read a SharedCount (4-byte big-endian)          -> "count N"
//   member-join PATH ID DATA  start a GroupMember with payload DATA (UTF-8) and
//                        wait until its node exists                      -> "joined ID"
//   members ID EXPECT MS wait (at most MS) until member ID's getCurrentMembers,
//                        rendered "id=data,..." sorted by id, is EXPECT  -> "members RENDERED"
//   member-update ID DATA  setThisData                                   -> "updated ID"
//   member-leave ID      close the GroupMember                           -> "left ID"
//   latch-start PATH ID  start a LeaderLatch with id ID (it queues in the
//                        background)                                     -> "started ID"
//   latch-close ID       close that LeaderLatch                          -> "closed ID"
//   counter-get PATH     DistributedAtomicLong.get                       -> "counter V"
//   counter-add PATH N   DistributedAtomicLong.add (optimistic)          -> "added ok|failed PRE POST"
//   counter-cas PATH E N DistributedAtomicLong.compareAndSet             -> "cas ok|failed PRE"
//   counter-incr ID PATH ROUNDS [LOCKPATH]  ROUNDS increments on a thread of their own (promoted
//                        to an InterProcessMutex at LOCKPATH if given)   -> later "incremented ID OK FAILED"
//   value-set PATH [HEX] SharedValue.setValue (seeded with the bytes)    -> "value-set VERSION"
//   value-get PATH       SharedValue.getVersionedValue                   -> "value VERSION [HEX]"
//   quit
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.atomic.AtomicValue;
import org.apache.curator.framework.recipes.atomic.DistributedAtomicLong;
import org.apache.curator.framework.recipes.atomic.PromotedToLock;
import org.apache.curator.framework.recipes.barriers.DistributedBarrier;
import org.apache.curator.framework.recipes.barriers.DistributedDoubleBarrier;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.framework.recipes.locks.*;
import org.apache.curator.framework.recipes.nodes.GroupMember;
import org.apache.curator.framework.recipes.shared.SharedValue;
import org.apache.curator.framework.recipes.shared.VersionedValue;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.curator.retry.RetryNTimes;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.*;
import java.util.concurrent.TimeUnit;

public class CuratorProbe {
    static final Map<String, InterProcessLock> held = new HashMap<>();
    static final Map<String, Lease> leases = new HashMap<>();
    static final Map<String, DistributedDoubleBarrier> members = new java.util.concurrent.ConcurrentHashMap<>();
    static final Map<String, GroupMember> groupMembers = new HashMap<>();
    static final Map<String, LeaderLatch> latches = new HashMap<>();

    static String render(Map<String, byte[]> members) {
        StringBuilder sb = new StringBuilder();
        for (Map.Entry<String, byte[]> e : new TreeMap<>(members).entrySet()) {
            if (sb.length() > 0) sb.append(',');
            sb.append(e.getKey()).append('=').append(new String(e.getValue(), java.nio.charset.StandardCharsets.UTF_8));
        }
        return sb.toString();
    }

    /** Waits (by watch) until a node exists. */
    static boolean awaitNode(CuratorFramework client, String path, long ms) throws Exception {
        long end = System.currentTimeMillis() + ms;
        while (true) {
            java.util.concurrent.CountDownLatch changed = new java.util.concurrent.CountDownLatch(1);
            if (client.checkExists().usingWatcher((org.apache.zookeeper.Watcher) e -> changed.countDown()).forPath(path) != null) return true;
            long left = end - System.currentTimeMillis();
            if (left <= 0 || !changed.await(left, TimeUnit.MILLISECONDS)) return false;
        }
    }

    /** Runs a blocking barrier call on its own thread; it answers when done. */
    static void background(String what, java.util.concurrent.Callable<Boolean> call) {
        new Thread(() -> {
            try { say((call.call() ? "" : "timeout ") + what); } catch (Exception e) { say("error " + what + " " + e); }
        }).start();
    }

    /** What a command does with one named entry; its answer, or null for none now. */
    interface Named<T> { String apply(T entry) throws Exception; }

    /**
     * Applies `command` to the entry of `map` named `key` (taken out of the
     * map first if `take`) and answers what it returns; answers
     * "error MISSING KEY" if there is no such entry.
     */
    static <T> void withNamed(Map<String, T> map, String key, boolean take, String missing, Named<T> command) throws Exception {
        T entry = take ? map.remove(key) : map.get(key);
        if (entry == null) { say("error " + missing + " " + key); return; }
        String answer = command.apply(entry);
        if (answer != null) say(answer);
    }

    static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static String nodeOf(InterProcessMutex m) throws Exception {
        // The holder's node: the first participant of its lock directory.
        Collection<String> nodes = m.getParticipantNodes();
        return nodes.isEmpty() ? "?" : nodes.iterator().next();
    }

    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.newClient(args[0], 10000, 15000, new ExponentialBackoffRetry(100, 5));
        client.start();
        if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) throw new RuntimeException("cannot connect to " + args[0]);
        say("ready");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String[] w = line.trim().split(" ");
            try {
                switch (w[0]) {
                    case "mutex": case "write": case "read": case "semmutex": case "revocable": {
                        String path = w[1];
                        long ms = Long.parseLong(w[2]);
                        InterProcessLock lock;
                        switch (w[0]) {
                            case "write": lock = new InterProcessReadWriteLock(client, path).writeLock(); break;
                            case "read": lock = new InterProcessReadWriteLock(client, path).readLock(); break;
                            case "semmutex": lock = new InterProcessSemaphoreMutex(client, path); break;
                            default: lock = new InterProcessMutex(client, path);
                        }
                        if (w[0].equals("revocable")) {
                            final InterProcessMutex m = (InterProcessMutex) lock;
                            m.makeRevocable(forLock -> {
                                try { say("revoked " + nodeOf(m)); } catch (Exception e) { say("error " + e); }
                            });
                        }
                        boolean ok = ms < 0 ? acquire(lock) : lock.acquire(ms, TimeUnit.MILLISECONDS);
                        if (!ok) { say("timeout"); break; }
                        held.put(path, lock);
                        say("acquired " + (lock instanceof InterProcessMutex ? nodeOf((InterProcessMutex) lock) : path));
                        break;
                    }
                    case "release":
                        withNamed(held, w[1], true, "not held", lock -> { lock.release(); return "released"; });
                        break;
                    case "revoke":
                        Revoker.attemptRevoke(client, w[1]);
                        say("revoke-sent");
                        break;
                    case "participants": {
                        LeaderLatch latch = new LeaderLatch(client, w[1]);
                        StringBuilder sb = new StringBuilder();
                        for (Participant p : latch.getParticipants()) {
                            if (sb.length() > 0) sb.append(',');
                            sb.append(p.getId()).append('|').append(p.isLeader());
                        }
                        say("participants " + sb);
                        break;
                    }
                    case "count": {
                        byte[] d = client.getData().forPath(w[1]);
                        say("count " + java.nio.ByteBuffer.wrap(d).getInt());
                        break;
                    }
                    case "barrier-set":
                        new DistributedBarrier(client, w[1]).setBarrier();
                        say("set");
                        break;
                    case "barrier-remove":
                        new DistributedBarrier(client, w[1]).removeBarrier();
                        say("removed");
                        break;
                    case "barrier-wait": {
                        // barrier-wait PATH MS: answers "passed" or "timeout passed".
                        DistributedBarrier b = new DistributedBarrier(client, w[1]);
                        long ms = Long.parseLong(w[2]);
                        background("passed", () -> { if (ms < 0) { b.waitOnBarrier(); return true; } return b.waitOnBarrier(ms, TimeUnit.MILLISECONDS); });
                        break;
                    }
                    case "dbenter": {
                        // dbenter ID PATH COUNT: one member; answers "entered ID".
                        DistributedDoubleBarrier b = new DistributedDoubleBarrier(client, w[2], Integer.parseInt(w[3]));
                        members.put(w[1], b);
                        background("entered " + w[1], () -> b.enter(60, TimeUnit.SECONDS));
                        break;
                    }
                    case "dbleave":
                        // dbleave ID: answers "left ID" once every member has left.
                        withNamed(members, w[1], true, "no member", b -> {
                            background("left " + w[1], () -> b.leave(60, TimeUnit.SECONDS));
                            return null;
                        });
                        break;
                    case "member-join": {
                        GroupMember m = new GroupMember(client, w[1], w[2], w[3].getBytes(java.nio.charset.StandardCharsets.UTF_8));
                        m.start();
                        groupMembers.put(w[2], m);
                        say(awaitNode(client, w[1] + "/" + w[2], 30000) ? "joined " + w[2] : "timeout");
                        break;
                    }
                    case "members":
                        // GroupMember tells no listener of its cache's changes, so
                        // its view is read again until it matches or time is up.
                        withNamed(groupMembers, w[1], false, "no member", m -> {
                            String expect = w[2].equals("-") ? "" : w[2];
                            long end = System.currentTimeMillis() + Long.parseLong(w[3]);
                            String seen = render(m.getCurrentMembers());
                            while (!seen.equals(expect) && System.currentTimeMillis() < end) {
                                Thread.sleep(20);
                                seen = render(m.getCurrentMembers());
                            }
                            return "members " + seen;
                        });
                        break;
                    case "member-update":
                        withNamed(groupMembers, w[1], false, "no member", m -> {
                            m.setThisData(w[2].getBytes(java.nio.charset.StandardCharsets.UTF_8));
                            return "updated " + w[1];
                        });
                        break;
                    case "member-leave":
                        withNamed(groupMembers, w[1], true, "no member", m -> { m.close(); return "left " + w[1]; });
                        break;
                    case "latch-start": {
                        LeaderLatch latch = new LeaderLatch(client, w[1], w[2]);
                        latch.start();
                        latches.put(w[2], latch);
                        say("started " + w[2]);
                        break;
                    }
                    case "latch-close":
                        withNamed(latches, w[1], true, "no latch", latch -> { latch.close(); return "closed " + w[1]; });
                        break;
                    case "counter-get":
                        say("counter " + new DistributedAtomicLong(client, w[1], new RetryNTimes(3, 1)).get().postValue());
                        break;
                    case "counter-add": {
                        AtomicValue<Long> v = new DistributedAtomicLong(client, w[1], new RetryNTimes(100, 1)).add(Long.parseLong(w[2]));
                        say("added " + (v.succeeded() ? "ok " : "failed ") + v.preValue() + " " + v.postValue());
                        break;
                    }
                    case "counter-cas": {
                        AtomicValue<Long> v = new DistributedAtomicLong(client, w[1], new RetryNTimes(3, 1))
                                .compareAndSet(Long.parseLong(w[2]), Long.parseLong(w[3]));
                        say("cas " + (v.succeeded() ? "ok " : "failed ") + v.preValue());
                        break;
                    }
                    case "counter-incr": {
                        String id = w[1], path = w[2];
                        int rounds = Integer.parseInt(w[3]);
                        DistributedAtomicLong n = w.length > 4
                                ? new DistributedAtomicLong(client, path, new RetryNTimes(3, 1),
                                      PromotedToLock.builder().lockPath(w[4]).retryPolicy(new RetryNTimes(100, 1)).build())
                                : new DistributedAtomicLong(client, path, new RetryNTimes(100, 1));
                        new Thread(() -> {
                            int ok = 0, failed = 0;
                            try {
                                for (int r = 0; r < rounds; r++) { if (n.increment().succeeded()) ok++; else failed++; }
                                say("incremented " + id + " " + ok + " " + failed);
                            } catch (Exception e) { say("error counter-incr " + id + " " + e); }
                        }).start();
                        break;
                    }
                    case "value-set": {
                        byte[] bytes = unhex(w.length > 2 ? w[2] : "");
                        try (SharedValue v = new SharedValue(client, w[1], bytes)) {
                            v.start();
                            v.setValue(bytes);
                            say("value-set " + v.getVersionedValue().getVersion());
                        }
                        break;
                    }
                    case "value-get": {
                        try (SharedValue v = new SharedValue(client, w[1], new byte[0])) {
                            v.start();
                            VersionedValue<byte[]> got = v.getVersionedValue();
                            say("value " + got.getVersion() + " " + hex(got.getValue()));
                        }
                        break;
                    }
                    case "quit":
                        for (InterProcessLock l : held.values()) { try { l.release(); } catch (Exception ignored) {} }
                        for (GroupMember m : groupMembers.values()) m.close();
                        for (LeaderLatch l : latches.values()) { try { l.close(); } catch (Exception ignored) {} }
                        client.close();
                        say("bye");
                        return;
                    default:
                        say("error unknown command " + w[0]);
                }
            } catch (Exception e) {
                say("error " + e.toString().replace('\n', ' '));
            }
        }
        client.close();
    }

    static String hex(byte[] bytes) {
        StringBuilder sb = new StringBuilder();
        for (byte b : bytes) sb.append(String.format("%02x", b & 0xff));
        return sb.toString();
    }

    static byte[] unhex(String s) {
        byte[] out = new byte[s.length() / 2];
        for (int i = 0; i < out.length; i++) out[i] = (byte) Integer.parseInt(s.substring(2 * i, 2 * i + 2), 16);
        return out;
    }

    static boolean acquire(InterProcessLock lock) throws Exception { lock.acquire(); return true; }
}
