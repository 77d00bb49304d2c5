/*
 * pause: the process that holds a pod's namespaces (containerd's sandbox_image). No image can be
 * pulled on the machines dbcloud's cluster runs on, so this is built here with gcc -static into a
 * one-file image (scripts/kube-images.sh). It sleeps until SIGTERM or SIGINT, and reaps children
 * it inherits as PID 1 of a shared PID namespace.
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
	(void)sig;
	_exit(0);
}

static void reap(int sig) {
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
}

int main(void) {
	struct sigaction term = {.sa_handler = stop}, chld = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
	if (sigaction(SIGTERM, &term, NULL) < 0 || sigaction(SIGINT, &term, NULL) < 0 ||
	    sigaction(SIGCHLD, &chld, NULL) < 0)
		return 1;
	for (;;)
		pause();
}
