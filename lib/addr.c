/* Listening addresses: see addr.h. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "addr.h"

#define EXAMPLES "127.0.0.1:8080, [::1]:8080, :8080; 0.0.0.0:8080 or [::]:8080 for every interface"

/* Digits only: strtol would take " 80", "+80" and "0x50". */
static bool
parse_port(const char *s, unsigned min, unsigned *port)
{
	if (!*s || strlen(s) > 5 || strspn(s, "0123456789") != strlen(s))
		return false;
	unsigned long v = 0;
	for (; *s; s++)
		v = v * 10 + (unsigned long)(*s - '0');
	if (v < min || v > 65535)
		return false;
	*port = (unsigned)v;
	return true;
}

/* Splits spec into host (no brackets; "" when absent) and port text. */
static bool
split(const char *spec, char *host, size_t hostlen, const char **port, bool *bracketed,
      char *err, size_t errlen)
{
	*bracketed = spec[0] == '[';
	const char *colon;
	if (*bracketed) {
		const char *end = strchr(spec, ']');
		if (!end || end[1] != ':') {
			snprintf(err, errlen, "'%s': expected [IPV6]:PORT", spec);
			return false;
		}
		spec++;
		colon = end + 1;
		if ((size_t)(end - spec) >= hostlen) {
			snprintf(err, errlen, "'%.80s...': host too long", spec - 1);
			return false;
		}
		snprintf(host, hostlen, "%.*s", (int)(end - spec), spec);
	} else {
		colon = strchr(spec, ':');
		if (colon && strchr(colon + 1, ':')) {
			snprintf(err, errlen, "'%s': an IPv6 address goes in brackets, as [::1]:8080", spec);
			return false;
		}
		size_t hl = colon ? (size_t)(colon - spec) : 0;
		if (hl >= hostlen) {
			snprintf(err, errlen, "'%.80s...': host too long", spec);
			return false;
		}
		snprintf(host, hostlen, "%.*s", (int)hl, spec);
	}
	*port = colon ? colon + 1 : spec;
	return true;
}

bool
gfs_addr_parse(const char *spec, unsigned flags, struct gfs_addr *a, char *err, size_t errlen)
{
	unsigned min = flags & GFS_ADDR_ANY_PORT ? 0 : 1;
	const char *port;
	bool bracketed;
	memset(a, 0, sizeof *a);
	if (!split(spec, a->host, sizeof a->host, &port, &bracketed, err, errlen))
		return false;
	if (!parse_port(port, min, &a->port)) {
		snprintf(err, errlen, "'%s': port '%s' is not a number from %u to 65535", spec, port,
		         min);
		return false;
	}
	if (!a->host[0] && !bracketed)
		snprintf(a->host, sizeof a->host, "127.0.0.1");
	unsigned char buf[sizeof(struct in6_addr)];
	a->family = bracketed ? AF_INET6 : AF_INET;
	if (inet_pton(a->family, a->host, buf) != 1) {
		snprintf(err, errlen, "'%s': '%s' is not a numeric %s address (%s)", spec, a->host,
		         bracketed ? "IPv6" : "IPv4", EXAMPLES);
		return false;
	}
	return true;
}

bool
gfs_hostport_parse(const char *spec, unsigned dflt, char *host, size_t hostlen, unsigned *port,
                   char *err, size_t errlen)
{
	char auth[300];
	snprintf(auth, sizeof auth, "%.*s", (int)strcspn(spec, "/"), spec);
	spec = auth;
	const char *h = spec, *hend, *colon;
	if (*spec == '[') {
		h = spec + 1;
		hend = strchr(h, ']');
		if (!hend || (hend[1] && hend[1] != ':')) {
			snprintf(err, errlen, "'%s': expected [IPV6] or [IPV6]:PORT", spec);
			return false;
		}
		colon = hend[1] ? hend + 1 : NULL;
	} else {
		colon = strchr(spec, ':');
		if (colon && strchr(colon + 1, ':')) {
			snprintf(err, errlen, "'%s': an IPv6 address goes in brackets, as [::1]:8080", spec);
			return false;
		}
		hend = colon ? colon : spec + strlen(spec);
	}
	if (hend == h || (size_t)(hend - h) >= hostlen) {
		snprintf(err, errlen, "'%.80s': %s", spec, hend == h ? "no host" : "host too long");
		return false;
	}
	snprintf(host, hostlen, "%.*s", (int)(hend - h), h);
	*port = dflt;
	if (colon && !parse_port(colon + 1, 1, port)) {
		snprintf(err, errlen, "'%s': port '%s' is not a number from 1 to 65535", spec, colon + 1);
		return false;
	}
	return true;
}

socklen_t
gfs_addr_sockaddr(const struct gfs_addr *a, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof *ss);
	if (a->family == AF_INET6) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons((uint16_t)a->port);
		inet_pton(AF_INET6, a->host, &s6->sin6_addr);
		return sizeof *s6;
	}
	struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
	s4->sin_family = AF_INET;
	s4->sin_port = htons((uint16_t)a->port);
	inet_pton(AF_INET, a->host, &s4->sin_addr);
	return sizeof *s4;
}

void
gfs_addr_format(const struct gfs_addr *a, char *buf, size_t len)
{
	bool v6 = a->family == AF_INET6;
	snprintf(buf, len, "%s%s%s:%u", v6 ? "[" : "", a->host, v6 ? "]" : "", a->port);
}
