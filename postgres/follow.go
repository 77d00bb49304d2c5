package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"dbcloud/sqlstore"
)

// revisionsChannel is the channel migration 0021's trigger announces
// every counter change on.
const revisionsChannel = "dbcloud_revisions"

// followerName is the follower connection's application_name.
const followerName = "dbcloud revisions"

// Retry pacing of the store's own connections (reconnecting).
const (
	reconnectMin = 50 * time.Millisecond
	reconnectMax = 2 * time.Second
)

// reconnecting runs connected, which holds one connection until it fails,
// until ctx ends: again after each failure, logged as msg, after a pause
// that doubles from reconnectMin to reconnectMax while connections fail
// at once, and starts over after one that lasted. A database that is down
// is thus not hammered, and a blip costs reconnectMin.
func reconnecting(ctx context.Context, logger *slog.Logger, msg string, connected func(context.Context) error) {
	wait := reconnectMin
	for {
		began := time.Now()
		err := connected(ctx)
		if ctx.Err() != nil {
			return
		}
		logger.Warn(msg, "error", err)
		if time.Since(began) > reconnectMax {
			wait = reconnectMin
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, reconnectMax)
	}
}

// follower keeps a Store's change counters current in memory with the
// commits of every plane sharing the database: one connection of its own
// LISTENs on revisionsChannel, then reads the whole table, then applies
// each notification as it comes. So the API's cached reads cost no query,
// and another plane's write is seen as soon as its notification arrives
// (sqlstore's revisionCache says what that means for read-your-writes).
// While the connection is down the Store is told to read the table again,
// and each new connection starts with a full read, so nothing missed in
// between is kept. It also listens to the planes' own messages (planes.go),
// in the same order as the counters, for read-your-writes across planes.
type follower struct {
	cfg    *pgx.ConnConfig
	store  *sqlstore.Store
	planes *planes
	logger *slog.Logger
	// pid is the server process of the current connection, for tests.
	pid atomic.Uint32
	// unread logs plane messages this version cannot read: a kind a later
	// version added, or anyone's NOTIFY on the channel.
	unread rateLog

	cancel context.CancelFunc
	done   sync.WaitGroup
}

// connConfig is the configuration of the store's own connections (the
// follower's, the sender's) to the database dsn names.
func connConfig(dsn string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse the store's address: %w", err)
	}
	// A connection that died without a word (a host gone, a cut cable)
	// must be noticed in seconds, not the kernel's two hours: meanwhile
	// no notification arrives and the counters kept grow old.
	d := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: time.Second, Count: 3}}
	cfg.DialFunc = d.DialContext
	return cfg, nil
}

// startFollower starts following the counters of the database cfg names,
// and the planes' messages for p.
func startFollower(cfg *pgx.ConnConfig, s *sqlstore.Store, p *planes) *follower {
	cfg = cfg.Copy()
	// Named, so that an operator (and a test) can tell it in pg_stat_activity.
	cfg.RuntimeParams["application_name"] = followerName
	ctx, cancel := context.WithCancel(context.Background())
	f := &follower{
		cfg: cfg, store: s, planes: p, cancel: cancel,
		logger: slog.Default().With("component", "store", "channel", revisionsChannel),
		unread: rateLog{every: time.Minute},
	}
	f.done.Add(1)
	go f.run(ctx)
	return f
}

// stop ends the follower and waits for it.
func (f *follower) stop() {
	f.cancel()
	f.done.Wait()
}

func (f *follower) run(ctx context.Context) {
	defer f.done.Done()
	reconnecting(ctx, f.logger, "store change notifications lost; reading counters from the store until reconnected", f.follow)
}

// follow connects, listens, hands the Store the whole table and then
// every notification, until the connection fails or ctx ends. Once it
// returns, the Store reads the counters from the database again, and
// only then is the plane told (deferred calls run last first), so that
// its bye is said once nothing is answered from memory (planes.go).
func (f *follower) follow(ctx context.Context) error {
	defer f.planes.listen(time.Time{})
	defer f.store.UnfollowRevisions()
	conn, err := pgx.ConnectConfig(ctx, f.cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	f.pid.Store(conn.PgConn().PID())
	// LISTEN before the read: a commit after the read is then announced,
	// and one before it is in what is read.
	for _, ch := range []string{revisionsChannel, planesChannel} {
		if _, err := conn.Exec(ctx, "LISTEN "+ch); err != nil {
			return fmt.Errorf("listen: %w", err)
		}
	}
	// Taken once LISTEN returned: every message sent before it was sent
	// before this moment.
	listening := time.Now()
	all, err := readAll(ctx, conn)
	if err != nil {
		return err
	}
	f.store.FollowRevisions(all)
	f.planes.listen(listening)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n.Channel == planesChannel {
			// Not worth starting over for: reading every counter again
			// would not make the message readable, and each such message
			// would cost the plane its memory and the others their
			// writers' whole bound. Ignoring it costs freshness nothing:
			// this plane's lease grows only from its own beats, and a
			// writer whose fence, ack or bye is ignored waits longer,
			// within its bound, never less.
			if err := f.planes.receive(n.Payload); err != nil {
				f.unread.warn(f.planes.logger, "store plane message ignored", "error", err)
			}
			continue
		}
		scope, rev, err := parseRevision(n.Payload)
		if err != nil {
			// Not ours to skip: a change might be lost. Start over.
			return err
		}
		f.store.NoteRevision(scope, rev)
	}
}

func readAll(ctx context.Context, conn *pgx.Conn) (map[string]int64, error) {
	rows, err := conn.Query(ctx, `SELECT scope, rev FROM revisions`)
	if err != nil {
		return nil, fmt.Errorf("read revisions: %w", err)
	}
	all := map[string]int64{}
	var scope string
	var rev int64
	_, err = pgx.ForEachRow(rows, []any{&scope, &rev}, func() error {
		all[scope] = rev
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read revisions: %w", err)
	}
	return all, nil
}

// parseRevision reads a payload "SCOPE REV".
func parseRevision(payload string) (string, int64, error) {
	i := strings.LastIndexByte(payload, ' ')
	if i < 0 {
		return "", 0, errors.New("revision notification without a counter: " + payload)
	}
	rev, err := strconv.ParseInt(payload[i+1:], 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("revision notification %q: %w", payload, err)
	}
	return payload[:i], rev, nil
}

// rateLog logs at most one warning per period, so that a stream of
// messages nobody can act on one by one does not flood the log; the next
// one logged says how many were left out.
type rateLog struct {
	every   time.Duration
	last    time.Time
	skipped int
}

func (r *rateLog) warn(logger *slog.Logger, msg string, args ...any) {
	now := time.Now()
	if !r.last.IsZero() && now.Sub(r.last) < r.every {
		r.skipped++
		return
	}
	if r.skipped > 0 {
		args = append(args, "not_logged", r.skipped)
	}
	logger.Warn(msg, args...)
	r.last, r.skipped = now, 0
}
