// Test helpers for integration tests that start real processes on loopback: a temporary
// directory and a child process whose stdout is read line by line (stderr captured).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status.h"

namespace pd::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "pd_test.XXXXXX";
    PD_CHECK(mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& bytes) const {
    const std::string p = path_ + "/" + name;
    std::ofstream out(p, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    PD_CHECK_MSG(out.good(), p.c_str());
    return p;
  }

 private:
  std::string path_;
};

// A child process with stdout and stderr captured through pipes.
class Process {
 public:
  explicit Process(const std::vector<std::string>& args) {
    int out[2], err[2];
    PD_CHECK(pipe(out) == 0 && pipe(err) == 0);
    pid_ = fork();
    PD_CHECK(pid_ >= 0);
    if (pid_ == 0) {
      dup2(out[1], 1);
      dup2(err[1], 2);
      close(out[0]);
      close(err[0]);
      std::vector<char*> argv;
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    close(err[1]);
    out_ = out[0];
    err_ = err[0];
  }
  ~Process() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(out_);
    close(err_);
  }

  // Reads stdout until a line matches `re` or `timeout` passes; returns the line or "".
  std::string WaitForLine(const std::regex& re, absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      size_t nl;
      while ((nl = out_buf_.find('\n')) != std::string::npos) {
        std::string line = out_buf_.substr(0, nl);
        out_buf_.erase(0, nl + 1);
        if (std::regex_search(line, re)) return line;
      }
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, 50) > 0) {
        char buf[4096];
        const ssize_t n = read(out_, buf, sizeof buf);
        if (n <= 0) return "";
        out_buf_.append(buf, n);
      }
    }
    return "";
  }

  // Waits for the exit; returns the exit code, or -1 on timeout / abnormal end.
  int Wait(absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

  std::string Stderr() {
    std::string s;
    char buf[4096];
    fcntl(err_, F_SETFL, O_NONBLOCK);
    ssize_t n;
    while ((n = read(err_, buf, sizeof buf)) > 0) s.append(buf, n);
    return s;
  }

  void Signal(int sig) { kill(pid_, sig); }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1, err_ = -1;
  std::string out_buf_;
};

}  // namespace pd::testing
