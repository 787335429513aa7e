// Command gridfsctl-ferretdb runs FerretDB embedded in a small program of our
// own. The upstream cmd/ferretdb binary cannot be built from the module proxy
// (it needs a generated version file); the embeddable package does not.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/FerretDB/FerretDB/ferretdb"
)

func main() {
	handler := flag.String("handler", "sqlite", "storage backend: sqlite or postgresql")
	listen := flag.String("listen", "127.0.0.1:27017", "TCP address to listen on")
	sqliteDir := flag.String("sqlite-dir", "", "directory for SQLite databases (sqlite handler)")
	pgURLEnv := flag.String("postgresql-url-env", "GRIDFSCTL_PG_URL",
		"environment variable holding the PostgreSQL URL (kept out of argv)")
	logLevel := flag.String("log-level", "warn", "debug, info, warn or error")
	flag.Parse()

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fatalf("bad --log-level %q", *logLevel)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	cfg := ferretdb.Config{
		Listener: ferretdb.ListenerConfig{TCP: *listen},
		Logger:   logger,
		Handler:  *handler,
	}
	switch *handler {
	case "sqlite":
		if *sqliteDir == "" {
			fatalf("--sqlite-dir is required with --handler sqlite")
		}
		if err := os.MkdirAll(*sqliteDir, 0o700); err != nil {
			fatalf("%s: %v", *sqliteDir, err)
		}
		cfg.SQLiteURL = "file:" + *sqliteDir + "/"
	case "postgresql":
		cfg.PostgreSQLURL = os.Getenv(*pgURLEnv)
		if cfg.PostgreSQLURL == "" {
			fatalf("$%s is empty; it must hold the PostgreSQL URL", *pgURLEnv)
		}
	default:
		fatalf("unknown --handler %q", *handler)
	}

	f, err := ferretdb.New(&cfg)
	if err != nil {
		fatalf("%v", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := f.Run(ctx); err != nil {
		fatalf("%v", err)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "gridfsctl-ferretdb: "+format+"\n", args...)
	os.Exit(1)
}
