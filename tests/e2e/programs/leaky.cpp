// leaky.cpp: deterministic leaking C++17 program for heapscope's e2e tests.
//
// Build:  g++ -std=c++17 -O1 -g -fPIE -pie leaky.cpp -o leaky_cpp
// Run under LD_PRELOAD=libjemalloc.so.2 (libstdc++'s operator new calls
// malloc, so jemalloc sees every allocation). No arguments, no output, exit 0.
//
// Truth, live at exit (jemalloc usable sizes), by the function that allocates
// (the leaf after allocator frames -- malloc, operator new, operator new[] --
// are pruned):
//
//   function (demangled)                            objects  request  usable      bytes
//   app::make_widgets()           new Widget<int>      1,000       24      32     32,000
//   app::Widget<int>::grow(unsigned long)
//                                 new int[100]         1,000      400     448    448,000
//   app::Registry::add_names(int) new std::vector          1       24      32         32
//   app::Registry::add_names(int) vector buffer            1  2048*32  65,536     65,536
//     (the vector is leaked; push_back 2,000 times; the earlier, smaller
//      buffers are freed by the growth, so they show only in alloc_*)
//   std::string bodies, caller app::Registry::add_names(int)
//                                 41 B each            2,000       41      48     96,000
//     (allocated inside libstdc++'s std::string code; the leaf frames are in
//      libstdc++ / inlined basic_string members, add_names is the first
//      frame of ours)
//   app::install_callbacks()::{lambda()#1}::operator()() const
//                                 new char[777]          500      777     896    448,000
//     (noinline lambda called through a std::function; its caller is
//      std::_Function_handler<void (), ...{lambda()#1}>::_M_invoke)
//   app::alloc_array()            new double[1000]       200     8000    8192  1,638,400
//   app::release_blob()           new app::Blob          300      600     640    192,000
//                                 (unique_ptr released)
//   -----------------------------------------------------------------------------------
//   program total                                      5,002              2,919,968
//
// plus libstdc++'s emergency exception pool allocated at start-up (1 object,
// 81,920 B with Debian 12's libstdc++), so jeprof's inuse total is
// 3,001,888 B in 5,003 objects.
//
// Each allocating line carries a "LEAK:<tag>" comment (see jemalloc.source_line).
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace app {

template <typename T>
class Widget {
  public:
    explicit Widget(int id) : id_(id) {}

    __attribute__((noinline)) void grow(std::size_t n)
    {
        data_ = new T[n];  // LEAK:widget-grow
        data_[0] = static_cast<T>(id_);
        size_ = n;
    }

  private:
    int id_;
    T *data_ = nullptr;
    std::size_t size_ = 0;
};

// Keep the leaked pointers reachable from globals so nothing is optimized out.
Widget<int> *widgets[1000];
std::vector<std::string> *registry_names;
char *callback_keep[500];
double *arrays[200];

struct Blob {
    char bytes[600];
};
Blob *blobs[300];

__attribute__((noinline)) void make_widgets()
{
    for (int i = 0; i < 1000; i++) {
        widgets[i] = new Widget<int>(i);  // LEAK:widget-new
        widgets[i]->grow(100);
    }
}

struct Registry {
    __attribute__((noinline)) static void add_names(int count)
    {
        registry_names = new std::vector<std::string>();  // LEAK:vector-object
        for (int i = 0; i < count; i++) {
            // 40 characters: longer than the 15-char SSO buffer, so heap-allocated.
            std::string s(40, static_cast<char>('a' + i % 26));
            registry_names->push_back(std::move(s));  // LEAK:vector-grow
        }
    }
};

__attribute__((noinline)) void install_callbacks()
{
    int next = 0;
    // noinline: the lambda gets a real frame named
    // app::install_callbacks()::{lambda()#1}::operator()() const
    std::function<void()> cb = [&next]() __attribute__((noinline)) {
        callback_keep[next] = new char[777];  // LEAK:lambda
        next++;
    };
    for (int i = 0; i < 500; i++)
        cb();
}

__attribute__((noinline)) void alloc_array()
{
    for (int i = 0; i < 200; i++) {
        arrays[i] = new double[1000];  // LEAK:new-array
        arrays[i][0] = i;
    }
}

__attribute__((noinline)) void release_blob()
{
    for (int i = 0; i < 300; i++) {
        std::unique_ptr<Blob> p(new Blob());  // LEAK:unique-ptr
        p->bytes[0] = static_cast<char>(i);
        blobs[i] = p.release();
    }
}

}  // namespace app

int main()
{
    app::make_widgets();
    app::Registry::add_names(2000);
    app::install_callbacks();
    app::alloc_array();
    app::release_blob();
    return 0;
}
