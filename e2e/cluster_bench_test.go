package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-batch/caddy-batch/batchapp"
	"github.com/caddy-batch/caddy-batch/durable"
)

// BenchmarkIdleCluster is what an idle instance asks of a real Redis, and
// spends of the CPU, per second, against the number of Idempotency-Key
// records kept (docs/performance.md, "An idle cluster"): each op is one
// recovery_interval (100ms) of an in-process Caddy with nothing to do,
// after its first scan and sweep; redis-cmds/s comes from Redis's INFO
// commandstats, cpu-ms/s from the process's rusage. It needs
// redis-server, and fills Redis with up to 50,000 records first:
//
//	go test -run '^$' -bench IdleCluster -benchtime 20x ./e2e
func BenchmarkIdleCluster(b *testing.B) {
	if !hasRedisServer() {
		b.Skip("redis-server is not installed")
	}
	for _, records := range []int{0, 1000, 10000, 50000} {
		addr := startRedisServer(b)
		host, port, _ := strings.Cut(addr, ":")
		keepRecords(b, batchapp.DurableStorage(newRedisStorage(b, host, port, "idle")), records)
		b.Run(fmt.Sprintf("records=%d", records), func(b *testing.B) {
			api := costAPI(1)
			option := redisOption(host, port, "idle") + "\n\tbatch {\n\t\trecovery_interval 100ms\n\t}"
			startGatewayStorage(b, api, newUpstream(b, api), option, costSite)
			defer caddy.Stop()
			time.Sleep(2 * time.Second) // the first scan and sweep
			if _, err := redisCommand(addr, "CONFIG", "RESETSTAT"); err != nil {
				b.Fatal(err)
			}
			cpu := processCPU(b)
			start := time.Now()
			b.ResetTimer()
			for range b.N {
				time.Sleep(100 * time.Millisecond)
			}
			b.StopTimer()
			took := time.Since(start).Seconds()
			total, _ := commandCalls(b, addr)
			b.ReportMetric(float64(total-1)/took, "redis-cmds/s") // less the RESETSTAT
			b.ReportMetric(float64(processCPU(b)-cpu)/float64(time.Millisecond)/took, "cpu-ms/s")
		})
	}
}

// BenchmarkKeyedBatchWithRecordsKept is a keyed all-or-nothing batch of
// three updates through an in-process Caddy on a real Redis, with 0 and
// with 20,000 Idempotency-Key records kept, recovery_interval 100ms: the
// records kept must not slow a batch down (docs/performance.md, "An idle
// cluster").
//
//	go test -run '^$' -bench KeyedBatchWithRecordsKept -benchtime 200x ./e2e
func BenchmarkKeyedBatchWithRecordsKept(b *testing.B) {
	if !hasRedisServer() {
		b.Skip("redis-server is not installed")
	}
	for _, records := range []int{0, 20000} {
		addr := startRedisServer(b)
		host, port, _ := strings.Cut(addr, ":")
		keepRecords(b, batchapp.DurableStorage(newRedisStorage(b, host, port, "keyed")), records)
		b.Run(fmt.Sprintf("records=%d", records), func(b *testing.B) {
			api := costAPI(1)
			option := redisOption(host, port, "keyed") + "\n\tbatch {\n\t\trecovery_interval 100ms\n\t}"
			g := startGatewayStorage(b, api, newUpstream(b, api), option, costSite)
			defer caddy.Stop()
			time.Sleep(2 * time.Second) // the first scan and sweep
			took := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				r := g.do(b, "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": "c"}]`,
					"Prefer", "atomic", "Idempotency-Key", durable.NewID())
				took = append(took, time.Since(start))
				if r.Status != 200 {
					b.Fatalf("%v", r)
				}
			}
			b.StopTimer()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2])/float64(time.Millisecond), "p50-ms")
		})
	}
}
