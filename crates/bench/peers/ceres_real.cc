// The Ceres side of `bench --suite real`: solves a BAL bundle-adjustment file or a g2o pose
// graph with C++ Ceres and the residuals of its bundle_adjuster and pose_graph_2d/3d examples
// (written here against Ceres's public API), and prints one line:
//
//   ceres <initial cost> <final cost> <iterations> <seconds> <linear solver>
//
// Usage (the bench builds and runs it when libceres-dev is installed):
//   g++ -O2 -std=c++17 crates/bench/peers/ceres_real.cc -o /tmp/ceres_real \
//       -I/usr/include/eigen3 -lceres -lglog -lgflags -lpthread
//   OMP_THREAD_LIMIT=1 /tmp/ceres_real bal FILE dense_schur|sparse_schur|iterative_schur THREADS
//   OMP_THREAD_LIMIT=1 /tmp/ceres_real g2o FILE THREADS
//
// Options follow the examples: Levenberg-Marquardt, 100 iterations for BA (points eliminated
// first, Jacobi preconditioner for the iterative Schur solver), 200 and sparse normal
// Cholesky for pose graphs, Ceres's default tolerances. The scene is not normalised as the
// bundle_adjuster example does (costs are invariant; the trust-region path may differ).
#include <ceres/ceres.h>
#include <ceres/rotation.h>
#include <Eigen/Core>
#include <Eigen/Geometry>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

struct Reprojection {
  double x, y;
  template <typename T>
  bool operator()(const T* camera, const T* point, T* r) const {
    T p[3];
    ceres::AngleAxisRotatePoint(camera, point, p);
    p[0] += camera[3]; p[1] += camera[4]; p[2] += camera[5];
    T xp = -p[0] / p[2], yp = -p[1] / p[2];
    T r2 = xp * xp + yp * yp;
    T d = T(1.0) + r2 * (camera[7] + camera[8] * r2);
    r[0] = camera[6] * d * xp - T(x);
    r[1] = camera[6] * d * yp - T(y);
    return true;
  }
};

static int bal(const char* path, const std::string& solver, int threads, ceres::Solver::Summary& s) {
  FILE* f = std::fopen(path, "r");
  if (!f) { std::fprintf(stderr, "cannot open %s\n", path); return 1; }
  int nc, np, no;
  if (std::fscanf(f, "%d %d %d", &nc, &np, &no) != 3) return 1;
  std::vector<int> cam(no), pt(no);
  std::vector<double> obs(2 * no), cams(9 * nc), pts(3 * np);
  for (int i = 0; i < no; ++i)
    if (std::fscanf(f, "%d %d %lf %lf", &cam[i], &pt[i], &obs[2 * i], &obs[2 * i + 1]) != 4) return 1;
  for (double& v : cams) if (std::fscanf(f, "%lf", &v) != 1) return 1;
  for (double& v : pts) if (std::fscanf(f, "%lf", &v) != 1) return 1;
  std::fclose(f);
  ceres::Problem problem;
  for (int i = 0; i < no; ++i) {
    auto* cost = new ceres::AutoDiffCostFunction<Reprojection, 2, 9, 3>(
        new Reprojection{obs[2 * i], obs[2 * i + 1]});
    problem.AddResidualBlock(cost, nullptr, &cams[9 * cam[i]], &pts[3 * pt[i]]);
  }
  ceres::Solver::Options o;
  o.max_num_iterations = 100;
  o.num_threads = threads;
  o.linear_solver_type = solver == "dense_schur"     ? ceres::DENSE_SCHUR
                         : solver == "sparse_schur" ? ceres::SPARSE_SCHUR
                                                    : ceres::ITERATIVE_SCHUR;
  o.preconditioner_type = ceres::JACOBI;
  auto* ordering = new ceres::ParameterBlockOrdering;
  for (int i = 0; i < np; ++i) ordering->AddElementToGroup(&pts[3 * i], 0);
  for (int i = 0; i < nc; ++i) ordering->AddElementToGroup(&cams[9 * i], 1);
  o.linear_solver_ordering.reset(ordering);
  ceres::Solve(o, &problem, &s);
  return 0;
}

static double wrap(double a) { return a - 2.0 * M_PI * std::floor((a + M_PI) / (2.0 * M_PI)); }
template <typename T> T wrap_t(const T& a) {
  T two_pi(2.0 * M_PI);
  return a - two_pi * ceres::floor((a + T(M_PI)) / two_pi);
}

struct AnglePlus {
  template <typename T> bool Plus(const T* x, const T* d, T* y) const { *y = wrap_t(*x + *d); return true; }
  template <typename T> bool Minus(const T* y, const T* x, T* d) const { *d = wrap_t(*y - *x); return true; }
};

struct Edge2d {
  double dx, dy, dt; Eigen::Matrix3d s;
  template <typename T>
  bool operator()(const T* xa, const T* ya, const T* ta, const T* xb, const T* yb, const T* tb, T* r) const {
    T c = ceres::cos(*ta), sn = ceres::sin(*ta);
    T px = *xb - *xa, py = *yb - *ya;
    Eigen::Matrix<T, 3, 1> e(c * px + sn * py - T(dx), -sn * px + c * py - T(dy), wrap_t(*tb - *ta - T(dt)));
    Eigen::Map<Eigen::Matrix<T, 3, 1>> out(r);
    out = s.cast<T>() * e;
    return true;
  }
};

struct Edge3d {
  Eigen::Vector3d p; Eigen::Quaterniond q; Eigen::Matrix<double, 6, 6> s;
  template <typename T>
  bool operator()(const T* pa, const T* qa, const T* pb, const T* qb, T* r) const {
    Eigen::Map<const Eigen::Matrix<T, 3, 1>> p_a(pa), p_b(pb);
    Eigen::Map<const Eigen::Quaternion<T>> q_a(qa), q_b(qb);
    Eigen::Quaternion<T> qa_inv = q_a.conjugate();
    Eigen::Quaternion<T> q_ab = qa_inv * q_b;
    Eigen::Matrix<T, 3, 1> p_ab = qa_inv * (p_b - p_a);
    Eigen::Quaternion<T> dq = q.template cast<T>() * q_ab.conjugate();
    Eigen::Matrix<T, 6, 1> e;
    e.template head<3>() = p_ab - p.template cast<T>();
    e.template tail<3>() = T(2.0) * dq.vec();
    Eigen::Map<Eigen::Matrix<T, 6, 1>> out(r);
    out = s.template cast<T>() * e;
    return true;
  }
};

static int g2o(const char* path, int threads, ceres::Solver::Summary& s) {
  std::ifstream f(path);
  if (!f) { std::fprintf(stderr, "cannot open %s\n", path); return 1; }
  std::map<long, std::vector<double>> poses;
  struct Raw { long a, b; std::vector<double> v; };
  std::vector<Raw> edges;
  std::string line, tag;
  bool three_d = false;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    if (!(is >> tag)) continue;
    std::vector<double> v; long a, b; double x;
    if (tag == "VERTEX_SE2" || tag == "VERTEX_SE3:QUAT") {
      three_d = tag != "VERTEX_SE2";
      is >> a; while (is >> x) v.push_back(x);
      if (three_d) { Eigen::Map<Eigen::Quaterniond> q(&v[3]); q.normalize(); } else v[2] = wrap(v[2]);
      poses[a] = v;
    } else if (tag == "EDGE_SE2" || tag == "EDGE_SE3:QUAT") {
      is >> a >> b; while (is >> x) v.push_back(x);
      edges.push_back({a, b, v});
    }
  }
  ceres::Problem problem;
  const int d = three_d ? 6 : 3;
  for (auto& e : edges) {
    Eigen::MatrixXd info(d, d);
    int k = three_d ? 7 : 3;
    for (int i = 0; i < d; ++i) for (int j = i; j < d; ++j) info(i, j) = info(j, i) = e.v[k++];
    Eigen::MatrixXd l = info.llt().matrixL();
    auto& pa = poses.at(e.a);
    auto& pb = poses.at(e.b);
    if (three_d) {
      Edge3d* t = new Edge3d;
      t->p = Eigen::Vector3d(e.v[0], e.v[1], e.v[2]);
      t->q = Eigen::Quaterniond(e.v[6], e.v[3], e.v[4], e.v[5]).normalized();
      t->s = l;
      problem.AddResidualBlock(new ceres::AutoDiffCostFunction<Edge3d, 6, 3, 4, 3, 4>(t), nullptr,
                               &pa[0], &pa[3], &pb[0], &pb[3]);
      problem.SetManifold(&pa[3], new ceres::EigenQuaternionManifold);
      problem.SetManifold(&pb[3], new ceres::EigenQuaternionManifold);
    } else {
      Edge2d* t = new Edge2d{e.v[0], e.v[1], wrap(e.v[2]), Eigen::Matrix3d(l)};
      problem.AddResidualBlock(new ceres::AutoDiffCostFunction<Edge2d, 3, 1, 1, 1, 1, 1, 1>(t), nullptr,
                               &pa[0], &pa[1], &pa[2], &pb[0], &pb[1], &pb[2]);
      problem.SetManifold(&pa[2], new ceres::AutoDiffManifold<AnglePlus, 1, 1>);
      problem.SetManifold(&pb[2], new ceres::AutoDiffManifold<AnglePlus, 1, 1>);
    }
  }
  auto& first = poses.begin()->second;
  for (size_t k = 0; k < (three_d ? 2u : 3u); ++k) {
    double* block = three_d ? &first[k == 0 ? 0 : 3] : &first[k];
    if (problem.HasParameterBlock(block)) problem.SetParameterBlockConstant(block);
  }
  ceres::Solver::Options o;
  o.max_num_iterations = 200;
  o.num_threads = threads;
  o.linear_solver_type = ceres::SPARSE_NORMAL_CHOLESKY;
  ceres::Solve(o, &problem, &s);
  return 0;
}

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  if (argc < 4) { std::fprintf(stderr, "usage: ceres_real bal FILE SOLVER THREADS | g2o FILE THREADS\n"); return 2; }
  ceres::Solver::Summary s;
  int rc = std::strcmp(argv[1], "bal") == 0
               ? (argc < 5 ? 2 : bal(argv[2], argv[3], std::atoi(argv[4]), s))
               : g2o(argv[2], std::atoi(argv[3]), s);
  if (rc != 0) return rc;
  std::printf("ceres %.9e %.9e %d %.6f %s\n", s.initial_cost, s.final_cost,
              (int)s.iterations.size() - 1, s.total_time_in_seconds,
              ceres::LinearSolverTypeToString(s.linear_solver_type_used));
  return 0;
}
