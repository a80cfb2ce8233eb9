// Command river-bench: River (github.com/riverqueue/river) on the bench's PostgreSQL,
// for bench/queue_scenarios.py (make bench-queue). Modes:
//
//	drain  -dsn DSN -jobs N -batch B -workers W   insert N no-op jobs B at a time
//	       (InsertManyFast: COPY), then start a client and time the drain of the backlog.
//	pickup -dsn DSN -jobs N -gap-min MS -gap-max MS [-rate R]   an idle client; N single
//	       jobs inserted at random gaps (or at R per second): the delay from just before
//	       each insert to its Work call.
//
// It prints one JSON object on stdout. River's schema is migrated by River's own migrator
// into schema "river" (search_path), apart from asynctier's tables.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

type NoopArgs struct {
	InsertedNs int64 `json:"inserted_ns"`
}

func (NoopArgs) Kind() string { return "noop" }

type NoopWorker struct {
	river.WorkerDefaults[NoopArgs]
	done    *atomic.Int64
	mu      sync.Mutex
	delays  []time.Duration
	measure bool
}

func (w *NoopWorker) Work(ctx context.Context, job *river.Job[NoopArgs]) error {
	if w.measure {
		d := time.Since(time.Unix(0, job.Args.InsertedNs))
		w.mu.Lock()
		w.delays = append(w.delays, d)
		w.mu.Unlock()
	}
	w.done.Add(1)
	return nil
}

func main() {
	mode := os.Args[1]
	fs := flag.NewFlagSet(mode, flag.ExitOnError)
	dsn := fs.String("dsn", "", "PostgreSQL DSN")
	jobs := fs.Int("jobs", 100000, "jobs")
	batch := fs.Int("batch", 1000, "jobs per InsertManyFast")
	workers := fs.Int("workers", 2000, "MaxWorkers of the default queue")
	cooldown := fs.Int("fetch-cooldown-ms", 2, "FetchCooldown (ms)")
	pollMs := fs.Int("fetch-poll-ms", 20, "FetchPollInterval (ms)")
	gapMin := fs.Int("gap-min", 20, "pickup: least gap between inserts (ms)")
	gapMax := fs.Int("gap-max", 200, "pickup: most gap between inserts (ms)")
	rate := fs.Float64("rate", 0, "pickup: inserts per second instead of random gaps")
	fs.Parse(os.Args[2:])
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(*dsn)
	check(err)
	cfg.ConnConfig.RuntimeParams["search_path"] = "river"
	admin, err := pgxpool.New(ctx, *dsn)
	check(err)
	_, err = admin.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS river")
	check(err)
	admin.Close()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	check(err)
	defer pool.Close()
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	check(err)
	_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	check(err)
	_, err = pool.Exec(ctx, "TRUNCATE river_job")
	check(err)

	done := &atomic.Int64{}
	worker := &NoopWorker{done: done, measure: mode == "pickup"}
	ws := river.NewWorkers()
	river.AddWorker(ws, worker)
	// River's own benchmark's settings (cmd/river/riverbench): its best, by its authors.
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		FetchCooldown:     time.Duration(*cooldown) * time.Millisecond,
		FetchPollInterval: time.Duration(*pollMs) * time.Millisecond,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: *workers}},
		Workers:           ws,
	})
	check(err)
	// A job counts as done once the completer has marked it so (River's bench counts the
	// same way), not when its Work returns.
	completed, cancelSub := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: *jobs + 1000, Kinds: []river.EventKind{river.EventKindJobCompleted}})
	defer cancelSub()
	finished := &atomic.Int64{}
	go func() {
		for range completed {
			finished.Add(1)
		}
	}()
	out := map[string]any{"river": "v0.51.2", "workers": *workers,
		"fetch_cooldown_ms": *cooldown, "fetch_poll_ms": *pollMs}
	switch mode {
	case "drain":
		start := time.Now()
		for at := 0; at < *jobs; at += *batch {
			n := min(*batch, *jobs-at)
			params := make([]river.InsertManyParams, n)
			for i := range params {
				params[i] = river.InsertManyParams{Args: NoopArgs{}}
			}
			_, err = client.InsertManyFast(ctx, params)
			check(err)
		}
		insertS := time.Since(start).Seconds()
		start = time.Now()
		check(client.Start(ctx))
		for finished.Load() < int64(*jobs) {
			time.Sleep(2 * time.Millisecond)
		}
		drainS := time.Since(start).Seconds()
		out["insert_per_s"] = float64(*jobs) / insertS
		out["drain_per_s"] = float64(*jobs) / drainS
	case "pickup":
		check(client.Start(ctx))
		time.Sleep(time.Second) // the client's producer and listener are up
		rng := rand.New(rand.NewSource(7))
		for i := 0; i < *jobs; i++ {
			if *rate > 0 {
				time.Sleep(time.Duration(float64(time.Second) / *rate))
			} else {
				time.Sleep(time.Duration(*gapMin+rng.Intn(*gapMax-*gapMin+1)) * time.Millisecond)
			}
			_, err = client.Insert(ctx, NoopArgs{InsertedNs: time.Now().UnixNano()}, nil)
			check(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for finished.Load() < int64(*jobs) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		worker.mu.Lock()
		ms := make([]float64, len(worker.delays))
		for i, d := range worker.delays {
			ms[i] = float64(d.Microseconds()) / 1000
		}
		worker.mu.Unlock()
		sort.Float64s(ms)
		out["picked"] = len(ms)
		out["pickup_p50_ms"] = ms[len(ms)/2]
		out["pickup_p99_ms"] = ms[min(len(ms)-1, len(ms)*99/100)]
	default:
		check(fmt.Errorf("mode %q: drain or pickup", mode))
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	client.Stop(stopCtx)
	check(json.NewEncoder(os.Stdout).Encode(out))
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "river-bench:", err)
		os.Exit(1)
	}
}
