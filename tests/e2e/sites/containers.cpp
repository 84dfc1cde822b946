// containers.cpp: C++ leaks that go through the standard library, for heapscope's site tests.
//
// Build:  g++ -std=c++17 -O2 -g containers.cpp -o containers
// Run under LD_PRELOAD=libjemalloc.so.2. No arguments; prints "pid=<pid>"; exit 0.
//
// Every leak below is allocated by a standard container on behalf of one line of this
// file (marked LEAK:<tag>); the containers live in objects that are never freed. A report
// must name that line (the first frame of this file), not the container's internals, and
// add up everything the line allocated. Each line allocates the same payload per call so the
// truth is a count times a size class (jemalloc's usable sizes, all exact size classes):
//
//   tag            function                          through                   calls  each
//   registry       Registry<std::string>::insert     map node + vector + string  2,000  8192+2048+128
//   blobs          load_blobs                        std::vector<char>            1,500  16,384
//   names          collect_names                     std::string (libstdc++.so)   3,000   4,096
//   tree           fill_tree                         std::map node                2,500   3,072 (node)
//   hash           fill_hash                         std::unordered_map node      2,000   5,120 (node)
//   shared         make_shared_parts                 std::make_shared             1,000  10,240
//   unique         make_unique_parts                 std::make_unique             1,200   6,144
//   lambda         (lambda in run_lambda)            new char[] in a lambda       1,000  12,288
//
// Payload sizes are chosen so the allocation's usable size is exactly "each" (see
// containers_truth in test_sites.py); bookkeeping (vector growth of the holders, hash
// buckets) is small next to them.
#include <array>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <unistd.h>
#include <unordered_map>
#include <vector>

namespace store {

struct Entry {
    std::vector<char> data;
    std::string note;
};

template <typename K>
class Registry {
  public:
    __attribute__((noinline)) void insert(const K& key, std::size_t n, std::size_t note)
    {
        // One line, three containers: a map node, a vector and a string per call. (GCC's
        // debug info gives the temporaries' inlined constructors the block's last line.)
        entries_.emplace(key, Entry{std::vector<char>(n), std::string(note, 'n')});  // LEAK:registry
        count_++;
    }  // LEAK:registry-end

  private:
    std::map<K, Entry> entries_;
    std::size_t count_ = 0;
};

struct Tree3k {
    std::array<char, 3000> bytes;
};
struct Hash5k {
    std::array<char, 5000> bytes;
};
struct Part10k {
    std::array<char, 10000> bytes;
};
struct Part6k {
    std::array<char, 6000> bytes;
};

}  // namespace store

// Holders, leaked on purpose (never deleted, so no destructor frees them at exit).
static auto* g_registry = new store::Registry<std::string>();
static auto* g_blobs = new std::vector<std::vector<char>>();
static auto* g_names = new std::vector<std::string>();
static auto* g_tree = new std::map<int, store::Tree3k>();
static auto* g_hash = new std::unordered_map<int, store::Hash5k>();
static auto* g_shared = new std::vector<std::shared_ptr<store::Part10k>>();
static auto* g_unique = new std::vector<std::unique_ptr<store::Part6k>>();
static auto* g_raw = new std::vector<char*>();

__attribute__((noinline)) void load_blobs(int n)
{
    g_blobs->reserve(n);
    for (int i = 0; i < n; i++) {
        g_blobs->emplace_back(16384);  // LEAK:blobs
    }
}

__attribute__((noinline)) void collect_names(int n)
{
    g_names->reserve(n);
    for (int i = 0; i < n; i++) {
        g_names->push_back(std::string(4000, static_cast<char>('a' + i % 26)));  // LEAK:names
    }
}

__attribute__((noinline)) void fill_tree(int n)
{
    for (int i = 0; i < n; i++) {
        (*g_tree)[i].bytes[0] = 1;  // LEAK:tree
    }
}

__attribute__((noinline)) void fill_hash(int n)
{
    g_hash->reserve(n);
    for (int i = 0; i < n; i++) {
        (*g_hash)[i].bytes[0] = 1;  // LEAK:hash
    }
}

__attribute__((noinline)) void make_shared_parts(int n)
{
    g_shared->reserve(n);
    for (int i = 0; i < n; i++) {
        g_shared->push_back(std::make_shared<store::Part10k>());  // LEAK:shared
    }
}

__attribute__((noinline)) void make_unique_parts(int n)
{
    g_unique->reserve(n);
    for (int i = 0; i < n; i++) {
        g_unique->push_back(std::make_unique<store::Part6k>());  // LEAK:unique
    }
}

__attribute__((noinline)) void run_lambda(int n)
{
    auto grab = [](std::size_t size) __attribute__((noinline)) {
        char* p = new char[size];  // LEAK:lambda
        p[size - 1] = 0;  // (no tail call: the lambda keeps its own frame)
        return p;
    };
    g_raw->reserve(n);
    for (int i = 0; i < n; i++) {
        g_raw->push_back(grab(12288));
    }
}

int main()
{
    std::printf("pid=%d\n", static_cast<int>(getpid()));
    for (int i = 0; i < 2000; i++) {
        // Keys short enough to live inside the string (no allocation of their own).
        g_registry->insert("k" + std::to_string(i), 8192, 2000);
    }
    load_blobs(1500);
    collect_names(3000);
    fill_tree(2500);
    fill_hash(2000);
    make_shared_parts(1000);
    make_unique_parts(1200);
    run_lambda(1000);
    return 0;
}
