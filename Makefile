# gridfsctl — build, test, install.
#   make              build ./gridfsctl (gcc by default; make CC=clang works too)
#   make asan         build build/asan/gridfsctl with AddressSanitizer + UBSan
#   make check        unit tests and integration tests (both builds) against the embedded backend
#   make demo         start the embedded backend, import a small poster tree, ls, get
#   make install PREFIX=/usr/local DESTDIR=

PREFIX  ?= /usr/local
DESTDIR ?=
CC      ?= cc
PYTEST  ?= python3 -m pytest
B       ?= build
BIN     ?= $(if $(filter build,$(B)),gridfsctl,$(B)/gridfsctl)

PKGS    := libmongoc-1.0 libbson-1.0 libcrypto libmicrohttpd inih
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS))
PKG_LIBS   := $(shell pkg-config --libs $(PKGS)) -lmagic -lpthread

VERSION := $(shell cat VERSION 2>/dev/null || echo 0.0.0)
WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wno-unused-parameter
CFLAGS  ?= -O2 -g
ALL_CFLAGS = -std=c11 -D_GNU_SOURCE -DGRIDFSCTL_VERSION='"$(VERSION)"' $(WARN) $(CFLAGS) $(PKG_CFLAGS)
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer

LIB_SRC := $(sort $(wildcard lib/*.c))
CMD_SRC := $(sort $(wildcard cmd/*.c))
HDRS    := $(wildcard lib/*.h cmd/*.h)
UNIT_SRC := $(sort $(wildcard tests/unit/test_*.c))

OBJ      := $(patsubst %.c,$(B)/obj/%.o,$(LIB_SRC) $(CMD_SRC))
ASAN_OBJ := $(patsubst %.c,$(B)/asan/obj/%.o,$(LIB_SRC) $(CMD_SRC))
LIB_OBJ      := $(patsubst %.c,$(B)/obj/%.o,$(LIB_SRC))
ASAN_LIB_OBJ := $(patsubst %.c,$(B)/asan/obj/%.o,$(LIB_SRC))
UNIT_BIN     := $(patsubst tests/unit/%.c,$(B)/unit/%,$(UNIT_SRC))
ASAN_UNIT_BIN := $(patsubst tests/unit/%.c,$(B)/asan/unit/%,$(UNIT_SRC))

MAN_SRC := $(wildcard man/*.scd)
MAN_OUT := $(patsubst man/%.scd,$(B)/man/%,$(MAN_SRC))

.DEFAULT_GOAL := all
.PHONY: all asan unit man check check-unit check-integration demo install clean backend deps

deps:
	scripts/deps

all: $(BIN) man

$(BIN): $(OBJ)
	@echo "  LD      $@"
	@$(CC) $(ALL_CFLAGS) -o $@ $(OBJ) $(PKG_LIBS)

$(B)/obj/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(ALL_CFLAGS) -c -o $@ $<

asan: $(B)/asan/gridfsctl

$(B)/asan/gridfsctl: $(ASAN_OBJ)
	@echo "  LD/SAN  $@"
	@$(CC) $(ALL_CFLAGS) $(SAN_FLAGS) -o $@ $(ASAN_OBJ) $(PKG_LIBS)

$(B)/asan/obj/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	@echo "  CC/SAN  $<"
	@$(CC) $(ALL_CFLAGS) $(SAN_FLAGS) -c -o $@ $<

$(B)/unit/%: tests/unit/%.c $(LIB_OBJ) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LIB_OBJ) $(PKG_LIBS) -lcmocka

$(B)/asan/unit/%: tests/unit/%.c $(ASAN_LIB_OBJ) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(SAN_FLAGS) -o $@ $< $(ASAN_LIB_OBJ) $(PKG_LIBS) -lcmocka

unit: $(UNIT_BIN) $(ASAN_UNIT_BIN)

man: $(MAN_OUT)

$(B)/man/%: man/%.scd
	@mkdir -p $(B)/man
	scdoc < $< > $@

backend:
	scripts/backend build

check-unit: unit
	@set -e; for t in $(UNIT_BIN) $(ASAN_UNIT_BIN); do echo "== $$t"; $$t; done

# Integration tests run the ASan build (leaks are errors) and the release build.
check-integration: gridfsctl asan man backend
	GRIDFSCTL_BIN=$(CURDIR)/$(B)/asan/gridfsctl $(PYTEST) -q tests $(PYTEST_ARGS)
	GRIDFSCTL_BIN=$(CURDIR)/gridfsctl $(PYTEST) -q tests $(PYTEST_ARGS)

# check and demo install what is missing first, then build in a fresh make
# (pkg-config flags are read when make starts).
check:
	scripts/deps
	$(MAKE) check-unit check-integration

demo:
	scripts/deps
	$(MAKE) gridfsctl backend
	scripts/demo

install: $(BIN) man
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man5
	install -m 755 gridfsctl $(DESTDIR)$(PREFIX)/bin/gridfsctl
	for m in $(MAN_OUT); do s=$${m##*.}; install -d $(DESTDIR)$(PREFIX)/share/man/man$$s; \
		install -m 644 $$m $(DESTDIR)$(PREFIX)/share/man/man$$s/; done
	install -D -m 644 completions/gridfsctl.bash $(DESTDIR)$(PREFIX)/share/bash-completion/completions/gridfsctl
	install -D -m 644 completions/_gridfsctl $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_gridfsctl
	install -D -m 644 completions/gridfsctl.fish $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/gridfsctl.fish

clean:
	rm -rf build gridfsctl
