// heapscope symbolizer fixture: C++ names that need care when shortened for display
// (templates, lambdas, std::function, operators, anonymous namespaces). Built with -O0 so
// that every function keeps its own body.
#include <cstdlib>
#include <functional>

namespace ns {
template <typename T> T *make(int n) { return static_cast<T *>(std::malloc(sizeof(T) * n)); }

struct Widget {
    void *grow(int n) const { return make<long>(n); }
    bool operator<(const Widget &) const { return std::malloc(1) != nullptr; }
};
} // namespace ns

namespace {
void *hidden(int n) { return std::malloc(n); }
} // namespace

template <typename F> void *run(F f) { return f(3); }

int main(int argc, char **)
{
    auto lam = [](int n) { return std::malloc(n); };
    std::function<void *(int)> f = lam;
    ns::Widget w;
    void *p = w.grow(argc);
    p = hidden(argc);
    p = f(argc);
    p = run(lam);
    return (w < w) && p != nullptr;
}
