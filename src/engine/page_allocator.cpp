// Reference-counted page ids (see page_allocator.h).
#include "engine/page_allocator.h"

#include "core/check.h"

namespace osprey::engine {

PageAllocator::PageAllocator(int n_pages) : ref_count_(size_t(std::max(n_pages, 0)), 0) {
    OSPREY_CHECK(n_pages > 0, "the KV cache needs at least one page, got ", n_pages);
    free_.reserve(size_t(n_pages));
    for (PageId p = n_pages - 1; p >= 0; --p) free_.push_back(p);  // page 0 is handed out first
}

void PageAllocator::check_id(PageId page) const {
    OSPREY_CHECK(page >= 0 && page < n_pages(), "page id ", page, " outside [0, ", n_pages(), ")");
}

int PageAllocator::ref_count(PageId page) const {
    check_id(page);
    return ref_count_[size_t(page)];
}

PageId PageAllocator::allocate() {
    OSPREY_CHECK(!free_.empty(), "KV cache out of pages (all ", n_pages(), " in use)");
    const PageId page = free_.back();
    free_.pop_back();
    ref_count_[size_t(page)] = 1;
    return page;
}

void PageAllocator::retain(PageId page) {
    check_id(page);
    OSPREY_CHECK(ref_count_[size_t(page)] > 0, "retain of free page ", page);
    ++ref_count_[size_t(page)];
}

void PageAllocator::release(PageId page) {
    check_id(page);
    OSPREY_CHECK(ref_count_[size_t(page)] > 0, "release of free page ", page);
    if (--ref_count_[size_t(page)] == 0) free_.push_back(page);
}

void PageAllocator::check_invariants() const {
    std::vector<uint8_t> in_free(ref_count_.size(), 0);
    for (PageId p : free_) {
        check_id(p);
        OSPREY_CHECK(!in_free[size_t(p)], "page ", p, " is twice in the free list");
        in_free[size_t(p)] = 1;
        OSPREY_CHECK(ref_count_[size_t(p)] == 0, "free page ", p, " has ", ref_count_[size_t(p)], " references");
    }
    for (size_t p = 0; p < ref_count_.size(); ++p) {
        OSPREY_CHECK(ref_count_[p] >= 0, "page ", p, " has a negative reference count");
        OSPREY_CHECK(ref_count_[p] > 0 || in_free[p], "page ", p, " has no reference but is not free (leaked)");
    }
}

}  // namespace osprey::engine
