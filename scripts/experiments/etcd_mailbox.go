// Experiment (not part of dlock): can an etcd 3.4 mutex hand over in O(1)
// watch messages, so that 32 waiters cost no more per handoff than 8?
// BENCHMARKS.md, "Session 14", records what it measured; run it with
// scripts/experiments/etcd-mailbox.sh.
//
// dlock's etcd store wakes waiters through one shared watch per directory
// and client: every handoff sends every waiting client its events, so the
// server's work per handoff grows with the waiters. A watch on just the
// predecessor, created per wait, is filed "unsynced" by etcd 3.4 whenever a
// write lands between its registration steps, and then waits for the 100 ms
// catch-up loop. Here each client instead keeps ONE watch for its whole
// session, on its own "mailbox" key, paying that registration once; a
// releaser deletes its key and writes "go" into its successor's mailbox in
// the same transaction. A per-key watch on the predecessor stays as the
// slow path (deaths, a successor the releaser did not know of).
//
// The releaser learns its successor either from a note each joiner writes
// into its predecessor's mailbox (--successor note: one more write per
// wait), or by a serializable read at release (--successor read).
package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
	"go.etcd.io/etcd/mvcc/mvccpb"
	"go.uber.org/zap"
)

var (
	endpoints = flag.String("endpoints", "127.0.0.1:2379", "etcd endpoints, comma-separated")
	clients   = flag.Int("clients", 8, "clients (one clientv3.Client + Session each)")
	seconds   = flag.Float64("seconds", 5, "run time")
	prefix    = flag.String("path", "/experiment/mailbox", "the lock's key prefix")
	successor = flag.String("successor", "note", "how a releaser knows its successor: note|read|piggyback")
	ctx       = context.Background()

	inside, violations, woken, fallback, reread int32
)

func check(err error) {
	if err != nil {
		panic(err)
	}
}

func mailboxOf(lease clientv3.LeaseID) string { return fmt.Sprintf("%s.mailbox/%x", *prefix, lease) }

type mutex struct {
	s     *concurrency.Session
	c     *clientv3.Client
	key   string
	rev   int64
	box   string
	goes  chan string
	mu    sync.Mutex
	notes map[int64]string // our key's create revision -> our successor's mailbox
	seen  int64            // the mod revision of the last mailbox event read
}

func newMutex() *mutex {
	lc := zap.NewProductionConfig()
	lc.Level = zap.NewAtomicLevelAt(zap.ErrorLevel)
	c, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*endpoints, ","), DialTimeout: 5 * time.Second, LogConfig: &lc})
	check(err)
	s, err := concurrency.NewSession(c, concurrency.WithTTL(10))
	check(err)
	m := &mutex{s: s, c: c, box: mailboxOf(s.Lease()), goes: make(chan string, 64), notes: map[int64]string{}}
	m.key = fmt.Sprintf("%s/%x", *prefix, s.Lease())
	put, err := c.Put(ctx, m.box, "", clientv3.WithLease(s.Lease()))
	check(err)
	m.seen = put.Header.Revision
	mail := c.Watch(clientv3.WithRequireLeader(ctx), m.box, clientv3.WithRev(m.seen+1))
	go func() {
		for wr := range mail {
			for _, ev := range wr.Events {
				m.mu.Lock()
				if ev.Kv.ModRevision > m.seen {
					m.seen = ev.Kv.ModRevision
				}
				m.mu.Unlock()
				v := string(ev.Kv.Value)
				if strings.HasPrefix(v, "go ") {
					select {
					case m.goes <- v[3:]:
					default: // stale ones are dropped; the slow path still wakes us
					}
				} else if strings.HasPrefix(v, "next ") {
					var rev int64
					var box string
					fmt.Sscanf(v[5:], "%d %s", &rev, &box)
					m.mu.Lock()
					m.notes[rev] = box
					m.mu.Unlock()
				}
			}
		}
	}()
	return m
}

func (m *mutex) lock() {
	for len(m.goes) > 0 { // pokes of earlier rounds
		<-m.goes
	}
	var pred *mvccpb.KeyValue
	watchFrom := int64(0)
	if *successor == "piggyback" {
		pred, watchFrom = m.enqueueNoted()
		if pred == nil && watchFrom > 0 {
			return // the queue was empty
		}
	} else {
		r, err := m.c.Put(ctx, m.key, "", clientv3.WithLease(m.s.Lease()))
		check(err)
		m.rev = r.Header.Revision
	}
	for {
		noted := pred != nil
		if pred == nil {
			g, err := m.c.Get(ctx, *prefix+"/", clientv3.WithPrefix(), clientv3.WithMaxCreateRev(m.rev-1),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1))
			check(err)
			if len(g.Kvs) == 0 {
				return
			}
			pred, watchFrom = g.Kvs[0], g.Header.Revision+1
		}
		if !noted && *successor != "read" {
			box := mailboxOf(clientv3.LeaseID(pred.Lease))
			_, err := m.c.Txn(ctx).If(clientv3.Compare(clientv3.Version(box), ">", 0)).
				Then(clientv3.OpPut(box, fmt.Sprintf("next %d %s", pred.CreateRevision, m.box), clientv3.WithIgnoreLease())).Commit()
			check(err)
		}
		want := fmt.Sprintf("%s %d", pred.Key, pred.CreateRevision)
		wctx, cancel := context.WithCancel(ctx)
		deleted := m.c.Watch(wctx, string(pred.Key), clientv3.WithRev(watchFrom), clientv3.WithFilterPut())
		ours := false
	wait:
		for {
			select {
			case p := <-m.goes:
				if ours = p == want; ours {
					break wait
				}
			case wr := <-deleted:
				if len(wr.Events) == 0 {
					continue
				}
				// The delete and its poke are one revision: give the poke a moment.
				select {
				case p := <-m.goes:
					ours = p == want
				case <-time.After(200 * time.Microsecond):
				}
				break wait
			}
		}
		cancel()
		if ours { // the holder before us handed over: nobody else is ahead
			atomic.AddInt32(&woken, 1)
			return
		}
		atomic.AddInt32(&fallback, 1)
		pred = nil
	}
}

// enqueueNoted creates our key and, in the same transaction, notes us in the
// mailbox of the queue's tail as read just before: a range compare proves
// that tail is still the newest key. Returns the tail noted and the revision
// to watch it from; no tail and a revision if the queue was empty; nil and 0
// if the tail moved meanwhile (then our key is created all the same, and the
// caller finds its predecessor and notes itself).
func (m *mutex) enqueueNoted() (*mvccpb.KeyValue, int64) {
	g, err := m.c.Get(ctx, *prefix+"/", clientv3.WithPrefix(), clientv3.WithSerializable(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1))
	check(err)
	var tail *mvccpb.KeyValue
	tailRev := int64(0)
	if len(g.Kvs) > 0 {
		tail, tailRev = g.Kvs[0], g.Kvs[0].CreateRevision
	}
	put := clientv3.OpPut(m.key, "", clientv3.WithLease(m.s.Lease()))
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(*prefix+"/"), "<", tailRev+1).WithPrefix()}
	ops := []clientv3.Op{put}
	if tail != nil {
		box := mailboxOf(clientv3.LeaseID(tail.Lease))
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(string(tail.Key)), "=", tailRev),
			clientv3.Compare(clientv3.Version(box), ">", 0))
		ops = append(ops, clientv3.OpPut(box, fmt.Sprintf("next %d %s", tailRev, m.box), clientv3.WithIgnoreLease()))
	}
	r, err := m.c.Txn(ctx).If(cmps...).Then(ops...).Else(put).Commit()
	check(err)
	m.rev = r.Header.Revision
	if !r.Succeeded {
		return nil, 0
	}
	return tail, m.rev + 1
}

func (m *mutex) unlock() {
	m.mu.Lock()
	box, known := m.notes[m.rev]
	delete(m.notes, m.rev)
	m.mu.Unlock()
	if *successor == "read" {
		g, err := m.c.Get(ctx, *prefix+"/", clientv3.WithPrefix(), clientv3.WithMinCreateRev(m.rev+1), clientv3.WithSerializable(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
		check(err)
		if known = len(g.Kvs) > 0; known {
			box = mailboxOf(clientv3.LeaseID(g.Kvs[0].Lease))
		}
	}
	if *successor == "piggyback" {
		m.releaseNoted(box, known)
		return
	}
	if !known {
		_, err := m.c.Delete(ctx, m.key)
		check(err)
		return
	}
	_, err := m.c.Txn(ctx).If(clientv3.Compare(clientv3.Version(box), ">", 0)).
		Then(clientv3.OpDelete(m.key), clientv3.OpPut(box, fmt.Sprintf("go %s %d", m.key, m.rev), clientv3.WithIgnoreLease())).
		Else(clientv3.OpDelete(m.key)).Commit()
	check(err)
}

func main() {
	flag.Parse()
	ms := make([]*mutex, *clients)
	for i := range ms {
		ms[i] = newMutex()
	}
	var wg sync.WaitGroup
	ops := make([]int, len(ms))
	start := time.Now()
	deadline := start.Add(time.Duration(*seconds * float64(time.Second)))
	for i := range ms {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for time.Now().Before(deadline) {
				ms[i].lock()
				if atomic.AddInt32(&inside, 1) != 1 {
					atomic.AddInt32(&violations, 1)
				}
				atomic.AddInt32(&inside, -1)
				ms[i].unlock()
				ops[i]++
			}
		}(i)
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	total := 0
	for _, o := range ops {
		total += o
	}
	fmt.Printf("peer=mailbox-experiment successor=%s clients=%d seconds=%.2f ops=%d ops_per_s=%.1f violations=%d woken_by_mailbox=%d fallbacks=%d release_rereads=%d\n",
		*successor, *clients, elapsed, total, float64(total)/elapsed, violations, woken, fallback, reread)
	for _, m := range ms {
		m.s.Close()
		m.c.Close()
	}
}

// releaseNoted deletes our key and wakes the successor that noted itself in
// our mailbox, in one transaction that holds only if our mailbox is as we
// last read it: a note that arrived meanwhile is read and sent again.
func (m *mutex) releaseNoted(box string, known bool) {
	for {
		m.mu.Lock()
		seen := m.seen
		m.mu.Unlock()
		then := []clientv3.Op{clientv3.OpDelete(m.key)}
		if known {
			wake := clientv3.OpPut(box, fmt.Sprintf("go %s %d", m.key, m.rev), clientv3.WithIgnoreLease())
			then = append(then, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Version(box), ">", 0)}, []clientv3.Op{wake}, nil))
		}
		r, err := m.c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(m.box), "=", seen)).
			Then(then...).Else(clientv3.OpGet(m.box)).Commit()
		check(err)
		if r.Succeeded {
			return
		}
		kvs := r.Responses[0].GetResponseRange().Kvs
		m.mu.Lock()
		if len(kvs) > 0 && kvs[0].ModRevision > m.seen {
			m.seen = kvs[0].ModRevision
			var rev int64
			var next string
			if n, _ := fmt.Sscanf(string(kvs[0].Value), "next %d %s", &rev, &next); n == 2 && rev == m.rev {
				box, known = next, true
			}
		}
		m.mu.Unlock()
		atomic.AddInt32(&reread, 1)
	}
}
