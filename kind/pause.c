/* The pod sandbox's process in kind's node image (kind/nodeimage.py builds it, static, as the
 * image the node's containerd and kubeadm name as pause): it holds the pod's namespaces open,
 * reaps the children a shared PID namespace leaves to it, and exits at once on SIGINT or SIGTERM. */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
    sigaction(SIGINT, &on_stop, NULL);
    sigaction(SIGTERM, &on_stop, NULL);
    sigaction(SIGCHLD, &on_child, NULL);
    for (;;)
        pause();
}
