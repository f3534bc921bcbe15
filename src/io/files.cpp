// Whole-file reads and atomic writes.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "qkv/io.h"

namespace qkv {

void refuse_devices_and_folders(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0)
    QKV_CHECK(!S_ISCHR(st.st_mode) && !S_ISBLK(st.st_mode) && !S_ISDIR(st.st_mode), path, ": not a file (",
              S_ISDIR(st.st_mode) ? "a folder" : "a device", ")");
}

std::string read_file(const std::string& path) {
  refuse_devices_and_folders(path);
  std::ifstream in(path, std::ios::binary);
  QKV_CHECK(in.good(), path, ": cannot open: ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  QKV_CHECK(!in.bad(), path, ": read failed");
  return ss.str();
}

namespace {

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "host";
  std::string h(name);
  std::replace(h.begin(), h.end(), '/', '_');
  return h.empty() ? "host" : h;
}

// Temporary files of earlier saves of `path` whose writer is gone: a save
// killed between creating its temporary file and renaming it leaves one. The
// name says which host and process wrote it ("<file>.tmp-<host>-<pid>-XXXXXX");
// only those of this host whose process no longer exists are removed, so a
// save still running elsewhere keeps its file. Nothing here can fail a save.
void remove_stale_temporaries(const std::string& path, const std::string& host) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string prefix = target.filename().string() + ".tmp-" + host + "-";
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());  // <pid>-XXXXXX
    char* after = nullptr;
    const long pid = std::strtol(rest.c_str(), &after, 10);
    if (after == rest.c_str() || *after != '-' || std::strlen(after) != 7 || pid <= 0 || pid == (long)getpid()) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;  // its writer may still be at work
    std::error_code ignored;
    fs::remove(it->path(), ignored);
  }
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  write_file_atomic(path, [&](const WriteBytes& write) { write(bytes.data(), bytes.size()); });
}

void write_file_atomic(const std::string& path, const std::function<void(const WriteBytes& write)>& produce) {
  const std::string host = host_name();
  remove_stale_temporaries(path, host);
  std::string tmpl = path + ".tmp-" + host + "-" + std::to_string(getpid()) + "-XXXXXX";
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  int fd = mkstemp(name.data());
  QKV_CHECK(fd >= 0, path, ": cannot create a temporary file beside it: ", std::strerror(errno));
  std::string tmp(name.data());
  bool open_here = true;  // the temporary file is still to be closed and removed on failure
  auto fail_with = [&](const char* what) {
    int err = errno;
    close(fd);
    unlink(tmp.c_str());
    open_here = false;
    fail(path, ": ", what, ": ", std::strerror(err));
  };
  const WriteBytes write_all = [&](const char* data, size_t size) {
    size_t done = 0;
    while (done < size) {
      ssize_t n = write(fd, data + done, size - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail_with("write failed");
      }
      done += (size_t)n;
    }
  };
  try {
    produce(write_all);
  } catch (...) {
    if (open_here) {  // else a failed write has closed and removed it already
      close(fd);
      unlink(tmp.c_str());
    }
    throw;
  }
  if (fchmod(fd, 0644) != 0) fail_with("chmod failed");
  if (fsync(fd) != 0) fail_with("fsync failed");
  if (close(fd) != 0) {
    unlink(tmp.c_str());
    fail(path, ": close failed: ", std::strerror(errno));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    fail(path, ": rename into place failed: ", std::strerror(err));
  }
  // Make the rename itself durable.
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  int dfd = open(dir.empty() ? "/" : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
}

}  // namespace qkv
