/*
 * ended.c: the reason dbcloud gives the sessions it ends.
 *
 * At a BLUE_GREEN upgrade's switch dbcloud ends the sessions of the old
 * server with pg_terminate_backend, which has no argument for a reason:
 * every client would read only "terminating connection due to
 * administrator command". Nor can the endpoint add one, since the
 * client's TLS session ends at the server. So dbcloud writes the reason
 * to END_REASON_FILE in the data directory (every server process's
 * working directory) before it ends them, and removes it after; a FATAL
 * that ends a session for an administrator (SQLSTATE 57P01) while the
 * file is there carries the reason as its message, the standard message
 * as its detail, and keeps its SQLSTATE, so drivers that connect again on
 * 57P01 still do. The file is in the service's own directory: a tenant
 * who writes one there changes only what its own sessions are told.
 *
 * The seal: from the moment the switch holds new sessions until the old
 * server stops (or serves again, when the switch is undone), dbcloud keeps
 * SEAL_FILE in the data directory, and every login that passed its
 * authentication is refused while it is there, but dbcloud's own (the
 * caller checks). A login forked before the hold, still authenticating,
 * is refused too, and so is one let in by a SIGCONT of a held postmaster,
 * which the service's OS user may send: none of them can write on the
 * old server after the last position the switch waits for. It needs no
 * reload, so dbcloud seals a postmaster it has already stopped (SIGSTOP)
 * and a client never meets a refusal meant for someone else (pg_hba.conf's
 * "no entry" 28000, which drivers take as final). Deleting the file, as
 * the OS user can, harms only that service's own upgrade.
 */
#include "postgres.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dbcloud_guard.h"

/* A reason longer than this is cut: it is one sentence. */
#define END_REASON_MAX 255

void
give_end_reason(ErrorData *edata)
{
	char		buf[END_REASON_MAX + 1];
	ssize_t		n;
	int			fd;

	if (edata->elevel != FATAL || edata->sqlerrcode != ERRCODE_ADMIN_SHUTDOWN ||
		!edata->output_to_client)
		return;
	/* Never an error here: this runs while an error is being reported. */
	fd = open(END_REASON_FILE, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return;
	n = read(fd, buf, END_REASON_MAX);
	close(fd);
	if (n <= 0)
		return;
	buf[n] = '\0';
	/*
	 * One line of printable ASCII, whatever the file holds: a byte past
	 * ASCII could be half a character once cut, and the conversion to the
	 * client's encoding would then fail while the FATAL is being sent.
	 */
	for (ssize_t i = 0; i < n; i++)
	{
		if (buf[i] == '\n')
		{
			buf[i] = '\0';
			break;
		}
		if ((unsigned char) buf[i] < 0x20 || (unsigned char) buf[i] >= 0x7f)
			buf[i] = ' ';
	}
	if (buf[0] == '\0')
		return;
	/*
	 * In the error's own memory context, which EmitErrorReport has made
	 * current. elog.h calls edits of edata other than output_to_server
	 * unsupported; on 15 and 17 (the versions built and tested) the message
	 * is sent to the client after the hook, from edata. The hook runs only
	 * when the FATAL goes to the server's log too, as it does unless
	 * log_min_messages is PANIC, which only a superuser sets.
	 */
	if (edata->detail == NULL)
		edata->detail = edata->message;
	edata->message = pstrdup(buf);
}

/*
 * refuse_if_sealed ends a login with SQLSTATE 57P03 (cannot_connect_now,
 * what PostgreSQL says while it starts up or shuts down: drivers and
 * poolers take it as "try again", unlike 28000) while SEAL_FILE exists.
 * Without the file it costs one failed lstat of a name in the working
 * directory, once per login, and changes nothing else.
 */
void
refuse_if_sealed(void)
{
	struct stat st;

	if (lstat(SEAL_FILE, &st) != 0)
		return;
	ereport(FATAL,
			(errcode(ERRCODE_CANNOT_CONNECT_NOW),
			 errmsg("this service is switching to a new PostgreSQL version"),
			 errdetail("New sessions are refused on the old server until the switch is over (a BLUE_GREEN upgrade)."),
			 errhint("Connect again in a few seconds.")));
}
