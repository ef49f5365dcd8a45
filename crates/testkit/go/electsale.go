// Election sale: etcd's Go concurrency.Election candidates that, while
// leader, sell one item of a stock kept under an etcd key (a non-atomic
// read-then-write, guarded only by leadership), then resign and campaign
// again, until the stock is gone. The other side of dlock's mixed-election
// tests (crates/dlock/tests/etcd_go_interop.rs): run next to dlock
// candidates on the same election prefix, the stock must end at exactly 0
// with every unit sold once. Built offline in GOPATH mode from Debian's etcd
// 3.4 sources, as shared/peers/etcd-go/run.sh builds peerbench.go (see
// crates/testkit/src/go.rs).
//
//	electsale --endpoints 127.0.0.1:2379 --path /e --stock-key /stock --clients 3
//
// Prints one line: `peer=etcd-go-3.4 electsale sold=N clients=C violations=V`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
	"go.uber.org/zap"
)

var (
	endpoints = flag.String("endpoints", "127.0.0.1:2379", "comma-separated etcd endpoints")
	path      = flag.String("path", "/election", "election prefix")
	stockKey  = flag.String("stock-key", "/stock", "key holding the stock counter (decimal text)")
	clients   = flag.Int("clients", 3, "candidates, each with its own client and session")
	ttl       = flag.Int("ttl", 10, "session TTL in seconds")
	ctx       = context.Background()
)

var inside, violations, sold int32

func main() {
	flag.Parse()
	var wg sync.WaitGroup
	for i := 0; i < *clients; i++ {
		lc := zap.NewProductionConfig()
		lc.Level = zap.NewAtomicLevelAt(zap.ErrorLevel)
		c, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*endpoints, ","), DialTimeout: 5 * time.Second, LogConfig: &lc})
		check(err)
		s, err := concurrency.NewSession(c, concurrency.WithTTL(*ttl))
		check(err)
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			defer c.Close()
			defer s.Close()
			e := concurrency.NewElection(s, *path)
			for {
				check(e.Campaign(ctx, fmt.Sprintf("go-%d-%d", os.Getpid(), id)))
				if atomic.AddInt32(&inside, 1) != 1 {
					atomic.AddInt32(&violations, 1)
				}
				left := getInt(c, *stockKey)
				if left > 0 {
					time.Sleep(100 * time.Microsecond)
					_, err := c.Put(ctx, *stockKey, strconv.Itoa(left-1))
					check(err)
					atomic.AddInt32(&sold, 1)
				}
				atomic.AddInt32(&inside, -1)
				check(e.Resign(ctx))
				if left <= 0 {
					return
				}
			}
		}(i)
	}
	wg.Wait()
	fmt.Printf("peer=etcd-go-3.4 electsale sold=%d clients=%d violations=%d\n", sold, *clients, violations)
}

func getInt(c *clientv3.Client, key string) int {
	r, err := c.Get(ctx, key)
	check(err)
	if len(r.Kvs) == 0 {
		check(fmt.Errorf("key %s not found", key))
	}
	n, err := strconv.Atoi(string(r.Kvs[0].Value))
	check(err)
	return n
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "electsale:", err)
		os.Exit(1)
	}
}
