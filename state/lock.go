package state

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// LockName is the lock file's name under state.dir.
const LockName = "narwhal.lock"

// Lock is a held lock on a state directory: one process per state (a second `narwhal serve` on
// the same directory would restore and overwrite the first one's live state).
type Lock struct{ f *os.File }

// ErrLocked is Acquire's error for a directory another live process holds.
var ErrLocked = errors.New("state directory in use")

// Acquire takes the state directory's lock (an OS file lock, flock, held for the process's
// life and released by the kernel when it ends, so a lock file left by a dead process is no
// obstacle) and writes this process's pid in it. A directory held by another process is an
// error naming the directory and the holder's pid. The directory is created 0700 (the state
// names every engine); a lock file that is a symbolic link is refused, not followed: writing
// the pid would truncate whatever it points to.
func Acquire(dir string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state.dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, LockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("state.dir %s: %s is a symbolic link: narwhal does not follow it (remove it; serve creates the lock file itself)", dir, path)
	}
	if err != nil {
		return nil, fmt.Errorf("state.dir %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		data, _ := os.ReadFile(path)
		_ = f.Close()
		holder := strings.TrimSpace(string(data))
		if _, perr := strconv.Atoi(holder); perr != nil {
			holder = "unknown"
		}
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: state.dir %s is held by another narwhal serve (pid %s): one process per state directory; give this one its own state.dir", ErrLocked, dir, holder)
		}
		return nil, fmt.Errorf("state.dir %s: locking %s: %w", dir, path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

// Release gives the lock up (the process's end does too).
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
