# gridfsctl — build, test, install.
#   make              build ./gridfsctl (gcc by default; make CC=clang works too)
#   make asan         build build/asan/gridfsctl with AddressSanitizer + UBSan
#   make check        unit tests and integration tests (both builds) against the embedded backend
#   make check-long   the reliability suite (tests/long, docs/reliability.md); make fuzz: HTTP fuzzer
#   make demo         start the embedded backend, import a small poster tree, ls, get
#   make install PREFIX=/usr/local DESTDIR=   (make uninstall, same PREFIX/DESTDIR, undoes it)

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

LIB_SRC := $(sort $(wildcard lib/*.c lib/mirror/*.c lib/supervise/*.c lib/serve/*.c))
CMD_SRC := $(sort $(wildcard cmd/*.c))
HDRS    := $(wildcard lib/*.h lib/mirror/*.h lib/supervise/*.h lib/serve/*.h cmd/*.h)
# Each object depends on the headers it includes (the compiler lists them in
# a .d file beside it) and on this Makefile, whose flags it was built with.
DEPFLAGS = -MMD -MP
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
.PHONY: all asan unit man check check-unit check-integration demo install clean backend deps \
	fuzz check-long

deps:
	scripts/deps

all: $(BIN) man

$(BIN): $(OBJ)
	@echo "  LD      $@"
	@$(CC) $(ALL_CFLAGS) -o $@ $(OBJ) $(PKG_LIBS)

$(B)/obj/%.o: %.c Makefile
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(ALL_CFLAGS) $(DEPFLAGS) -c -o $@ $<

asan: $(B)/asan/gridfsctl

$(B)/asan/gridfsctl: $(ASAN_OBJ)
	@echo "  LD/SAN  $@"
	@$(CC) $(ALL_CFLAGS) $(SAN_FLAGS) -o $@ $(ASAN_OBJ) $(PKG_LIBS)

$(B)/asan/obj/%.o: %.c Makefile
	@mkdir -p $(dir $@)
	@echo "  CC/SAN  $<"
	@$(CC) $(ALL_CFLAGS) $(SAN_FLAGS) $(DEPFLAGS) -c -o $@ $<

$(B)/unit/%: tests/unit/%.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(DEPFLAGS) -MF $@.d -MT $@ -o $@ $< $(LIB_OBJ) $(PKG_LIBS) -lcmocka

$(B)/asan/unit/%: tests/unit/%.c $(ASAN_LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(SAN_FLAGS) $(DEPFLAGS) -MF $@.d -MT $@ -o $@ $< $(ASAN_LIB_OBJ) $(PKG_LIBS) -lcmocka

-include $(OBJ:.o=.d) $(ASAN_OBJ:.o=.d) $(UNIT_BIN:=.d) $(ASAN_UNIT_BIN:=.d)

unit: $(UNIT_BIN) $(ASAN_UNIT_BIN)

man: $(MAN_OUT)

$(B)/man/%: man/%.scd
	@mkdir -p $(B)/man
	scdoc < $< > $@

backend:
	scripts/backend build

check-unit: unit
	@set -e; for t in $(UNIT_BIN) $(ASAN_UNIT_BIN); do echo "== $$t"; $$t; done

# Integration tests run the ASan build (leaks are errors) and the release build,
# each in a temporary tree of its own under $(B): pytest's clean-up of the
# shared /tmp/pytest-of-USER recurses, and a deep tree left there by any
# earlier run (mirror's depth tests make 1,500 levels) would end this one.
check-integration: $(BIN) asan man backend
	rm -rf $(B)/pytest && mkdir -p $(B)/pytest
	GRIDFSCTL_BIN=$(abspath $(B)/asan/gridfsctl) $(PYTEST) -q --basetemp=$(B)/pytest/asan tests $(PYTEST_ARGS)
	GRIDFSCTL_BIN=$(abspath $(BIN)) $(PYTEST) -q --basetemp=$(B)/pytest/release tests $(PYTEST_ARGS)

# check and demo install what is missing first, then build in a fresh make
# (pkg-config flags are read when make starts).
check:
	scripts/deps
	$(MAKE) check-unit check-integration

# The HTTP fuzz harness (tests/fuzz/): clang's libFuzzer with ASan+UBSan over
# the pure parsers serve uses, seeded from the committed corpus. New inputs go
# to $(B)/fuzz/corpus, never into the tree; a finding is left as
# $(B)/fuzz/crash-* and fails the target. FUZZ_SEED=0 draws a seed (printed).
FUZZ_SECONDS ?= 60
FUZZ_SEED ?= 0
# All of lib/, not a hand-picked list: what the parsers link against moves.
FUZZ_SRC := tests/fuzz/fuzz_http.c $(LIB_SRC)
FUZZ_FLAGS := -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer

$(B)/fuzz/fuzz_http: $(FUZZ_SRC) $(HDRS)
	@mkdir -p $(dir $@)
	clang $(ALL_CFLAGS) $(FUZZ_FLAGS) -o $@ $(FUZZ_SRC) $(PKG_LIBS)

fuzz: $(B)/fuzz/fuzz_http
	@mkdir -p $(B)/fuzz/corpus
	$(B)/fuzz/fuzz_http -max_total_time=$(FUZZ_SECONDS) -max_len=512 -timeout=10 -seed=$(FUZZ_SEED) \
		-dict=tests/fuzz/http.dict -artifact_prefix=$(B)/fuzz/ -print_final_stats=1 \
		$(B)/fuzz/corpus tests/fuzz/corpus

# The long reliability suite (tests/long/, docs/reliability.md): crash and
# fault injection, hostile data under the sanitizers, HTTP abuse. Runs
# against the ASan build; LONG_SCALE scales the fault counts (1 = full).
LONG_SCALE ?= 1
check-long: asan man backend
	GRIDFSCTL_BIN=$(abspath $(B)/asan/gridfsctl) GRIDFSCTL_LONG_SCALE=$(LONG_SCALE) \
		$(PYTEST) -q --basetemp=$(abspath $(B)/long-tmp) tests/long $(PYTEST_ARGS)

demo:
	scripts/deps
	$(MAKE) $(BIN) backend
	scripts/demo

# Shipped as documentation: the units, the logrotate file and the supervisor
# configurations are examples to copy into /etc, with the binary's path set
# to where this install puts it.
DOCDIR  ?= $(PREFIX)/share/doc/gridfsctl
CONTRIB := $(sort $(wildcard contrib/*/*) $(wildcard examples/*))
DOCS    := docs/cron.md docs/scale-out.md
MAN_DST  = $(foreach m,$(MAN_OUT),$(DESTDIR)$(PREFIX)/share/man/man$(subst .,,$(suffix $(m)))/$(notdir $(m)))
COMP_DST = $(DESTDIR)$(PREFIX)/share/bash-completion/completions/gridfsctl \
	$(DESTDIR)$(PREFIX)/share/zsh/site-functions/_gridfsctl \
	$(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/gridfsctl.fish

install: $(BIN) man
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man5
	install -m 755 $(BIN) $(DESTDIR)$(PREFIX)/bin/gridfsctl
	for m in $(MAN_OUT); do s=$${m##*.}; install -d $(DESTDIR)$(PREFIX)/share/man/man$$s; \
		install -m 644 $$m $(DESTDIR)$(PREFIX)/share/man/man$$s/; done
	install -D -m 644 completions/gridfsctl.bash $(DESTDIR)$(PREFIX)/share/bash-completion/completions/gridfsctl
	install -D -m 644 completions/_gridfsctl $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_gridfsctl
	install -D -m 644 completions/gridfsctl.fish $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/gridfsctl.fish
	for f in $(CONTRIB); do install -d $(DESTDIR)$(DOCDIR)/$$(dirname $$f) && \
		sed 's|/usr/local/bin/gridfsctl|$(PREFIX)/bin/gridfsctl|g' $$f > $(DESTDIR)$(DOCDIR)/$$f && \
		chmod 644 $(DESTDIR)$(DOCDIR)/$$f || exit 1; done
	install -m 644 $(DOCS) $(DESTDIR)$(DOCDIR)/

# Removes what install put, and the documentation directories it made; the
# shared directories (bin, man1, completions) stay.
.PHONY: uninstall
uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/gridfsctl $(MAN_DST) $(COMP_DST)
	rm -f $(addprefix $(DESTDIR)$(DOCDIR)/,$(CONTRIB) $(notdir $(DOCS)))
	for d in $(sort $(dir $(CONTRIB))) contrib/; do \
		if [ -d $(DESTDIR)$(DOCDIR)/$$d ]; then rmdir $(DESTDIR)$(DOCDIR)/$$d || exit 1; fi; done
	if [ -d $(DESTDIR)$(DOCDIR) ]; then rmdir $(DESTDIR)$(DOCDIR); fi

clean:
	rm -rf $(B) $(BIN)
