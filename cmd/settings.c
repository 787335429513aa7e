/*
 * Settings: where the command line left the connection unset, the
 * environment ($GRIDFSCTL_URI, $GRIDFSCTL_TIMEOUT) and the config file fill
 * it in; then the connection they name.
 */
#include <ini.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cmd.h"

struct file_settings {
	char *uri, *db, *bucket;
	char why[300];      /* what is wrong with the first line inih was told is wrong */
};

/*
 * A misspelt key or section would be a setting silently not taken (a
 * bucket name ignored, so another bucket written): it is an error, named
 * with its line by ini_parse_file's return.
 */
static int
on_ini(void *user, const char *section, const char *name, const char *value)
{
	struct file_settings *fs = user;
	bool first = fs->why[0] == '\0';
	if (strcmp(section, "connection") != 0) {
		if (first)
			snprintf(fs->why, sizeof fs->why, "unknown section [%s] (there is only [connection])",
			         section);
		return 0;
	}
	char **slot = strcmp(name, "uri") == 0 ? &fs->uri
	            : strcmp(name, "db") == 0 ? &fs->db
	            : strcmp(name, "bucket") == 0 ? &fs->bucket : NULL;
	if (!slot) {
		if (first)
			snprintf(fs->why, sizeof fs->why, "unknown key '%s' in [connection] (uri, db, bucket)",
			         name);
		return 0;
	}
	free(*slot);
	*slot = strdup(value);
	return 1;
}

static char *
config_path(void)
{
	const char *p = getenv("GRIDFSCTL_CONFIG");
	if (p)
		return strdup(p);
	char buf[4096];
	const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
	if (xdg && *xdg)
		snprintf(buf, sizeof buf, "%s/gridfsctl/config", xdg);
	else if (home && *home)
		snprintf(buf, sizeof buf, "%s/.config/gridfsctl/config", home);
	else
		return NULL;
	return strdup(buf);
}

int
load_settings(void)
{
	const char *env_uri = getenv("GRIDFSCTL_URI");
	if (!G.uri && env_uri && *env_uri)
		G.uri = env_uri;
	const char *timeout = getenv("GRIDFSCTL_TIMEOUT");
	long secs;
	if (timeout && *timeout) {
		if (!parse_int(timeout, 1, 86400, &secs)) {
			usage_error("GRIDFSCTL_TIMEOUT takes seconds from 1 to 86400, not '%s'", timeout);
			return -1;
		}
		gfs_conn_set_timeout((int)secs * 1000);
	}

	char *path = config_path();
	struct file_settings fs = {0};
	FILE *f = path ? fopen(path, "r") : NULL;
	if (!f && path && getenv("GRIDFSCTL_CONFIG")) {
		warn_("%s", path);
		free(path);
		return -1;
	}
	if (f) {
		int line = ini_parse_file(f, on_ini, &fs);
		struct stat st;
		bool shared = fstat(fileno(f), &st) == 0 && (st.st_mode & 077);
		fclose(f);
		if (line != 0) {
			char *why = printable(fs.why, strlen(fs.why));
			fprintf(stderr, "%s: %s:%d: %s\n", progname, path, line,
			        line < 0 ? "cannot read" : *why ? why : "cannot parse");
			free(why);
			free(fs.uri);
			free(fs.db);
			free(fs.bucket);
			free(path);
			return -1;
		}
		if (fs.uri && shared && strchr(fs.uri, '@'))
			fprintf(stderr, "%s: warning: %s holds credentials but others can read it (chmod 600)\n",
			        progname, path);
	}
	free(path);
	if (!G.uri && fs.uri)
		G.uri = fs.uri;
	else
		free(fs.uri);
	if (!G.db && fs.db)
		G.db = fs.db;
	else
		free(fs.db);
	if (!G.bucket && fs.bucket)
		G.bucket = fs.bucket;
	else
		free(fs.bucket);
	if (!G.uri)
		G.uri = GFS_DEFAULT_URI;
	return 0;
}

gfs_conn *
connect_or_warn(void)
{
	gfs_error err;
	gfs_conn *conn = gfs_conn_open(G.uri, G.db, G.bucket, &err);
	if (!conn) {
		warnx_("%s", err.msg);
		return NULL;
	}
	return conn;
}

gfs_conn *
connect_for_writes(void)
{
	gfs_conn *conn = connect_or_warn();
	if (conn)
		gfs_conn_read_primary(conn);
	return conn;
}
