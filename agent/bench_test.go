package agent_test

import (
	"context"
	"fmt"
	"reflect"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// cpuTime is the process's user+system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func bigSnapshot(epoch uint64, n int) *snapshots.Snapshot {
	s := snap(epoch)
	for i := 0; i < n; i++ {
		s.VMs = append(s.VMs, vm(fmt.Sprintf("vm-%03d", i)))
	}
	for i := 0; i < n/10; i++ {
		s.Volumes = append(s.Volumes, vol(fmt.Sprintf("vol-%03d", i), 1))
	}
	return s
}

// BenchmarkIdleTick500 is one tick of a host with 500 running VMs (and 50
// volumes) and nothing to do: Tick, every worker's pass, and the report
// compared with the previous one, as the agent does before deciding not to
// write. Goal: under 20 ms of CPU per tick (cpu-ms/tick).
func BenchmarkIdleTick500(b *testing.B) {
	f := newFixture(b)
	s := bigSnapshot(1, 500)
	require.NoError(b, f.eng.Tick(context.Background(), s))
	require.NoError(b, f.eng.Settle(context.Background()))
	require.Equal(b, 500, f.prov.RunningCount())
	ctx := context.Background()
	prev := f.eng.Report()
	b.ReportAllocs()
	b.ResetTimer()
	start := cpuTime(b)
	for i := 0; i < b.N; i++ {
		if err := f.eng.Tick(ctx, s); err != nil {
			b.Fatal(err)
		}
		if err := f.eng.Settle(ctx); err != nil {
			b.Fatal(err)
		}
		st := f.eng.Report()
		if !reflect.DeepEqual(st, prev) {
			b.Fatal("an idle tick changed the report")
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime(b)-start)/float64(time.Millisecond)/float64(b.N), "cpu-ms/tick")
	f.eng.Close(ctx)
}

// BenchmarkIdleAgentMinute runs the whole agent (Run: ticks, polling of the
// snapshots branch of a local repository with fsnotify, status heartbeats)
// for 500 idle VMs with every interval 60 times shorter than the defaults,
// so one second of it does a production minute's work: one op is one such
// minute, and cpu-ms/min is the CPU an idle agent spends per minute.
func BenchmarkIdleAgentMinute(b *testing.B) {
	gittest.NeedGit(b)
	bare := gittest.NewBare(b)
	h := newHostAgent(b, bare, newClock(), nil)
	publish(b, bare, bigSnapshot(1, 500))
	require.NoError(b, h.once())

	ag, err := agent.New(agent.Config{Host: testHost, Repo: mustOpen(b, bare), Engine: h.eng, Store: mustStore(b, h.dir),
		Version: "bench", Log: quietLog(),
		TickInterval: agent.DefaultTickInterval / 60, PollInterval: agent.DefaultPollInterval / 60, Heartbeat: agent.DefaultHeartbeat / 60})
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ag.Run(ctx) }()
	time.Sleep(200 * time.Millisecond) // past the first step's fetch
	b.ResetTimer()
	start := cpuTime(b)
	time.Sleep(time.Duration(b.N) * time.Second)
	used := cpuTime(b) - start
	b.StopTimer()
	cancel()
	require.NoError(b, <-done)
	b.ReportMetric(float64(used)/float64(time.Millisecond)/float64(b.N), "cpu-ms/min")
}

// BenchmarkSnapshotHash500 is the cost of the same-epoch fence check on a
// snapshot parsed afresh (a new tip): one canonical encoding and a sha256.
func BenchmarkSnapshotHash500(b *testing.B) {
	s := bigSnapshot(1, 500)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := agent.SnapshotHash(s); err != nil {
			b.Fatal(err)
		}
	}
}
