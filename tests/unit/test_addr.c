/* Unit tests for the listening-address parser every listener shares. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "../../lib/addr.h"

static void
accepted(void **state)
{
	(void)state;
	static const struct {
		const char *spec, *host;
		unsigned port;
		int family;
		const char *shown;
	} ok[] = {
		{"127.0.0.1:8080", "127.0.0.1", 8080, AF_INET, "127.0.0.1:8080"},
		{":8080", "127.0.0.1", 8080, AF_INET, "127.0.0.1:8080"}, /* no host: loopback */
		{"8080", "127.0.0.1", 8080, AF_INET, "127.0.0.1:8080"},
		{"0.0.0.0:1", "0.0.0.0", 1, AF_INET, "0.0.0.0:1"},
		{"[::]:65535", "::", 65535, AF_INET6, "[::]:65535"},
		{"[::1]:8081", "::1", 8081, AF_INET6, "[::1]:8081"},
		{"10.1.2.3:00080", "10.1.2.3", 80, AF_INET, "10.1.2.3:80"},
	};
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		struct gfs_addr a;
		char err[300] = "", shown[96];
		if (!gfs_addr_parse(ok[i].spec, 0, &a, err, sizeof err))
			fail_msg("'%s' refused: %s", ok[i].spec, err);
		assert_string_equal(a.host, ok[i].host);
		assert_int_equal(a.port, ok[i].port);
		assert_int_equal(a.family, ok[i].family);
		gfs_addr_format(&a, shown, sizeof shown);
		assert_string_equal(shown, ok[i].shown);
	}
}

static void
refused(void **state)
{
	(void)state;
	static const struct {
		const char *spec, *msg;
	} bad[] = {
		{"127.0.0.1:99999", "port '99999' is not a number from 1 to 65535"},
		{"127.0.0.1:0", "port '0'"},
		{"127.0.0.1:", "port ''"},
		{"127.0.0.1:+80", "port '+80'"},
		{"127.0.0.1: 80", "port ' 80'"},
		{"127.0.0.1:0x50", "port '0x50'"},
		{"127.0.0.1:9999999999999999999999", "port '9999999999999999999999'"},
		{"", "port ''"},
		{"::1:8080", "an IPv6 address goes in brackets"},
		{"[::1]", "expected [IPV6]:PORT"},
		{"[::1]8080", "expected [IPV6]:PORT"},
		{"[127.0.0.1]:80", "'127.0.0.1' is not a numeric IPv6 address"},
		{"[]:80", "'' is not a numeric IPv6 address"},
		{"localhost:80", "'localhost' is not a numeric IPv4 address"},
		{"256.0.0.1:80", "'256.0.0.1' is not a numeric IPv4 address"},
		{"0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0:80", "host too long"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct gfs_addr a;
		char err[300] = "";
		if (gfs_addr_parse(bad[i].spec, 0, &a, err, sizeof err))
			fail_msg("'%s' accepted", bad[i].spec);
		if (!strstr(err, bad[i].msg))
			fail_msg("'%s': '%s' does not contain '%s'", bad[i].spec, err, bad[i].msg);
		char named[120];
		snprintf(named, sizeof named, "'%.60s", bad[i].spec);
		if (strlen(bad[i].spec) < 60 && !strstr(err, named))
			fail_msg("'%s': '%s' does not name the spec", bad[i].spec, err);
	}
}

/* A URL's host[:port]: names allowed, the path cut off, the port checked all the same. */
static void
url_host_and_port(void **state)
{
	(void)state;
	static const struct {
		const char *spec, *host;
		unsigned port;
	} ok[] = {
		{"127.0.0.1:8080/_health", "127.0.0.1", 8080},
		{"localhost/x", "localhost", 80},
		{"[::1]:9/", "::1", 9},
		{"[::1]", "::1", 80},
		{"example.org", "example.org", 80},
	};
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		char host[256], err[300] = "";
		unsigned port;
		if (!gfs_hostport_parse(ok[i].spec, 80, host, sizeof host, &port, err, sizeof err))
			fail_msg("'%s' refused: %s", ok[i].spec, err);
		assert_string_equal(host, ok[i].host);
		assert_int_equal(port, ok[i].port);
	}
	static const struct {
		const char *spec, *msg;
	} bad[] = {
		{"127.0.0.1:99999/_health", "'127.0.0.1:99999': port '99999' is not a number from 1 to 65535"},
		{"h:/x", "port ''"},
		{":80/", "no host"},
		{"::1:80", "an IPv6 address goes in brackets"},
		{"[::1/", "expected [IPV6] or [IPV6]:PORT"},
		{"[::1]x", "expected [IPV6] or [IPV6]:PORT"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char host[256], err[300] = "";
		unsigned port;
		if (gfs_hostport_parse(bad[i].spec, 80, host, sizeof host, &port, err, sizeof err))
			fail_msg("'%s' accepted", bad[i].spec);
		if (!strstr(err, bad[i].msg))
			fail_msg("'%s': '%s' does not contain '%s'", bad[i].spec, err, bad[i].msg);
	}
}

/* Only a listener that reports the port it got may ask for any free one. */
static void
any_port(void **state)
{
	(void)state;
	struct gfs_addr a;
	char err[300];
	assert_true(gfs_addr_parse("127.0.0.1:0", GFS_ADDR_ANY_PORT, &a, err, sizeof err));
	assert_int_equal(a.port, 0);
	assert_false(gfs_addr_parse("127.0.0.1:65536", GFS_ADDR_ANY_PORT, &a, err, sizeof err));
	assert_non_null(strstr(err, "not a number from 0 to 65535"));
	assert_false(gfs_addr_parse("127.0.0.1:0", 0, &a, err, sizeof err));
}

static void
socket_addresses(void **state)
{
	(void)state;
	struct gfs_addr a;
	char err[300];
	struct sockaddr_storage ss;
	assert_true(gfs_addr_parse(":8080", 0, &a, err, sizeof err));
	assert_int_equal(gfs_addr_sockaddr(&a, &ss), sizeof(struct sockaddr_in));
	const struct sockaddr_in *s4 = (const struct sockaddr_in *)&ss;
	assert_int_equal(s4->sin_family, AF_INET);
	assert_int_equal(ntohs(s4->sin_port), 8080);
	assert_int_equal(ntohl(s4->sin_addr.s_addr), INADDR_LOOPBACK);
	assert_true(gfs_addr_parse("[::1]:9", 0, &a, err, sizeof err));
	assert_int_equal(gfs_addr_sockaddr(&a, &ss), sizeof(struct sockaddr_in6));
	const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&ss;
	assert_int_equal(s6->sin6_family, AF_INET6);
	assert_int_equal(ntohs(s6->sin6_port), 9);
	assert_true(IN6_IS_ADDR_LOOPBACK(&s6->sin6_addr));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(accepted),
		cmocka_unit_test(refused),
		cmocka_unit_test(any_port),
		cmocka_unit_test(url_host_and_port),
		cmocka_unit_test(socket_addresses),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
